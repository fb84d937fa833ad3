"""The DataModule contract (docs/interfaces.md) and the shared part of its implementations."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from flashtrain.data.sampling import EpochSampler, rank_share
from flashtrain.data.stream_identity import IDENTITY_KEY, check_same_data
from flashtrain.data.tokenization import Tokenizer

TASKS = ("lm", "mlm", "classification")
IGNORE_INDEX = -100  # label value the losses skip


@dataclass(frozen=True)
class DataRun:
    """What the run, not the data config, decides for every loader (build_data's arguments)."""

    seq_len: int
    micro_batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    eval_batches: int | None = None  # validation batches per rank (None: all there is)


class DataModule:
    """What the trainer gets from build_data.

    task: "lm" | "mlm" | "classification"; vocab_size: int; num_classes: int or None.
    tokenizer: the Tokenizer its ids come from (flashtrain.data.tokenization), or None for data
    that comes as ids (synthetic tasks, Pathfinder pixels); checkpoints record its name.
    pads_sequences (a class attribute): batches may hold padding (attention_mask 0), which
    context parallelism cannot attend around.
    train_batches(): endless iterator of batches for this rank, continuing from the current
    stream position (one live iterator at a time: they share the position).
    val_batches(): finite, identical on every call, a disjoint share per rank (same count), at
    most eval_batches batches per rank (None: all the validation data).
    state_dict() / load_state_dict(): the training stream position, with data_identity, what
    the position counts in (stream_identity.py): loading it onto other data raises OtherDataError.
    loss_bounds(): None, or {what: loss in nats} that put a run's loss in context.
    loss_verdict(eval_loss): None, or a sentence saying what a final eval loss shows.
    prepare(cfg): the one-off work (tokenizing, generating) before any run; what it made.
    command_line_settings(cfg): {key: value} train.py and scripts/prepare_data.py apply to cfg
    (their top level is guarded, so they may start worker processes); {} for most loaders.
    check_run_settings(cfg, seq_len=, eval_batches=): refuses what the config and the run's
    settings alone rule out, before anything is read or made (build_data; the trainer at start).

    Constructed as cls(cfg, run): cfg the loader's dataclass from flashtrain.data.config (the
    class attribute `Config`, whose `loader` default is the key in registry.LOADERS), run a
    DataRun, whose fields become attributes of the module. for_config(cfg): the class that runs
    a config (itself, unless a flag such as data.streaming picks another).
    """

    Config: type

    task: str
    vocab_size: int
    num_classes: int | None = None
    tokenizer: Tokenizer | None = None
    pads_sequences: bool = False  # batches may hold padding (attention_mask 0)

    def __init__(self, run: DataRun):
        self.seq_len, self.micro_batch_size, self.seed = run.seq_len, run.micro_batch_size, run.seed
        self.rank, self.world_size, self.eval_batches = run.rank, run.world_size, run.eval_batches

    @classmethod
    def for_config(cls, cfg) -> type[DataModule]:
        return cls

    @classmethod
    def prepare(cls, cfg, *, progress: bool = True) -> dict:
        return {"note": f"{cfg.name} is generated or read on the fly; nothing to prepare"}

    @classmethod
    def check_run_settings(cls, cfg, *, seq_len: int, eval_batches: int | None) -> None:
        """Refuse (ValueError) what `cfg` with the run's seq_len and eval_batches alone rules
        out: known from the config, so build_data checks it before any tokenizer, corpus or
        image is touched, and the trainer's config check (flashtrain/train/config.py:
        check_data_fits) before the model is built, dry runs included. Nothing by default."""

    @classmethod
    def command_line_settings(cls, cfg) -> dict:
        """Config keys the command-line programs (train.py, scripts/prepare_data.py) set on
        top of cfg: worker processes that the library, callable from any script, leaves off."""
        return {}

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        raise NotImplementedError

    def loss_bounds(self) -> dict[str, float] | None:
        return None

    def loss_verdict(self, eval_loss: float) -> str | None:
        return None

    def val_batches(self) -> Iterable[dict[str, torch.Tensor]]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    @cached_property
    def data_identity(self) -> dict[str, Any]:
        """What defines the training stream, {field as the user sets it: value}; computed once
        (the state is copied every step)."""
        return {"data.loader": self.Config.loader, "seq_len": self.seq_len} | self.identity_fields()

    def identity_fields(self) -> dict[str, Any]:
        """The loader's own part of data_identity (its corpus, tokenizer, task parameters)."""
        return {}


class SampledDataModule(DataModule):
    """A DataModule whose training stream is an EpochSampler over items that `make_batch` turns
    into a batch; the stream position is the sampler's."""

    sampler: EpochSampler
    micro_batch_size: int

    def make_batch(self, epochs, items) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            epochs, items = self.sampler.take(self.micro_batch_size)
            yield self.make_batch(epochs, items)

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict(), IDENTITY_KEY: self.data_identity}

    def load_state_dict(self, state: dict) -> None:
        check_same_data(state, self.data_identity)
        self.sampler.load_state_dict(state["sampler"])


class EvalBatches:
    """A finite, re-iterable sequence of batches made on demand, identical on every pass.

    items: this rank's item ids in order; make(items) -> batch; batches of micro_batch_size
    (the last one may be shorter), at most max_batches of them (None: all).
    """

    def __init__(self, make, items, micro_batch_size: int, max_batches: int | None):
        if max_batches is not None:
            items = items[: int(max_batches) * micro_batch_size]
        self.make, self.items, self.size = make, items, micro_batch_size

    def __len__(self) -> int:
        return -(-len(self.items) // self.size)

    def __iter__(self):
        for lo in range(0, len(self.items), self.size):
            yield self.make(self.items[lo : lo + self.size])


def eval_items(count: int, rank: int, world_size: int, what: str):
    """This rank's share of `count` evaluation items; an error when a rank would get none."""
    if count < world_size:
        raise ValueError(
            f"{what} has {count} items, fewer than world_size={world_size}: every rank needs one"
        )
    return rank_share(count, rank, world_size)
