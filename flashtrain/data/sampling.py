"""Which items each DDP rank reads, in which order, and how to resume exactly.

Every epoch has its own seeded permutation of the items (the same on all ranks); rank r of w takes
positions r, r + w, r + 2w, ... of it, cut so that all ranks get the same count. Ranks therefore
never read the same item in an epoch and stay in lockstep. The stream position is (epoch, offset
into this rank's share): the same number on every rank, so rank 0's saved state restores them all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def rank_share(count: int, rank: int, world_size: int) -> np.ndarray:
    """Positions rank takes out of `count`: rank, rank + world, ..., the same number per rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    per_rank = count // world_size
    return rank + world_size * np.arange(per_rank, dtype=np.int64)


def check_same_stream(state: dict, stream, keys=("seed", "world_size")) -> None:
    """Refuse a saved stream position that `stream` cannot continue exactly (keys the state
    lacks, saved by an older version, are not checked)."""
    for key in keys:
        if key in state and state[key] != getattr(stream, key):
            raise ValueError(
                f"data state was saved with {key}={state[key]}, this run has "
                f"{getattr(stream, key)}; the stream resumes exactly only with the same {key}"
            )


def epoch_rng(seed: int, epoch: int, purpose: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(epoch, purpose)))


class EpochSampler:
    """An endless, resumable stream of item ids for one rank.

    num_items: the item count, or a function epoch -> count (e.g. LM windows with a per-epoch
    offset). shuffle=False keeps the natural order (still dealt to ranks).
    """

    def __init__(
        self,
        num_items: int | Callable[[int], int],
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        self._count = num_items if callable(num_items) else (lambda epoch, n=int(num_items): n)
        self.seed, self.rank, self.world_size, self.shuffle = seed, rank, world_size, shuffle
        self.epoch, self.offset = 0, 0
        self._cached_epoch, self._cached = -1, np.empty(0, dtype=np.int64)
        rank_share(0, rank, world_size)  # validates rank / world_size
        if self.per_rank(0) == 0:
            raise ValueError(
                f"an epoch has {self._count(0)} items, fewer than world_size={world_size}: "
                "every rank needs at least one (use more data or a shorter seq_len)"
            )

    def per_rank(self, epoch: int) -> int:
        return self._count(epoch) // self.world_size

    def epoch_items(self, epoch: int) -> np.ndarray:
        """This rank's item ids for `epoch`, in reading order."""
        if epoch != self._cached_epoch:
            count = self._count(epoch)
            order = (
                epoch_rng(self.seed, epoch).permutation(count)
                if self.shuffle
                else np.arange(count, dtype=np.int64)
            )
            self._cached = order[rank_share(count, self.rank, self.world_size)]
            self._cached_epoch = epoch
        return self._cached

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` (epoch, item) pairs, crossing into the next epoch when one ends."""
        epochs, items = [], []
        while count > 0:
            share = self.epoch_items(self.epoch)
            piece = share[self.offset : self.offset + count]
            epochs.append(np.full(len(piece), self.epoch, dtype=np.int64))
            items.append(piece)
            count -= len(piece)
            self.offset += len(piece)
            if self.offset >= len(share):
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(epochs), np.concatenate(items)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict) -> None:
        check_same_stream(state, self)
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
