"""Language-model batches streamed from a corpus larger than the disk (`streaming: true`).

Documents are read lazily with `datasets` streaming, split across ranks (split_dataset_by_node),
optionally shuffled through a seeded buffer, tokenized on the fly, joined with EOS and cut into
windows of seq_len + 1 tokens. The position is (epoch, documents read by this rank, tokens read
but not yet emitted), so resuming replays the same seeded stream to exactly that point.
"""

from __future__ import annotations

import numpy as np

from flashtrain.data.config import cache_root, check_vocab_size
from flashtrain.data.corpus import load_split
from flashtrain.data.lm import fixed_windows, lm_batch
from flashtrain.data.module import DataModule
from flashtrain.data.tokenization import build_tokenizer

_DOCS_PER_READ = 64  # documents tokenized together


class StreamingLM(DataModule):
    task = "lm"
    num_classes = None

    def __init__(self, cfg: dict, *, seq_len, micro_batch_size, seed, rank=0, world_size=1):
        self.cfg = cfg
        self.tokenizer = build_tokenizer(cfg, cache_root(cfg))
        if self.tokenizer.eos_id is None:
            raise ValueError(f"tokenizer '{self.tokenizer.name}' has no EOS to join documents with")
        self.vocab_size = check_vocab_size(cfg, self.tokenizer.vocab_size, self.tokenizer.name)
        self.eos_id = self.tokenizer.eos_id
        self.text_field = cfg.get("text_field", "text")
        self.window, self.micro_batch_size = seq_len + 1, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.has_val_split = load_split(cfg, "validation", streaming=True) is not None
        self.val_docs = int(cfg.get("val_docs", 1000))
        self.epoch, self.docs_read = 0, 0
        self.pending = np.empty(0, dtype=np.int64)  # tokens read but not yet emitted
        self._val = None

    def _documents(self, epoch: int):
        """This rank's document stream for `epoch` (the validation documents left out)."""
        from datasets.distributed import split_dataset_by_node

        stream = load_split(self.cfg, "train", streaming=True)
        if not self.has_val_split:
            stream = stream.skip(self.val_docs)
        buffer = int(self.cfg.get("shuffle_buffer", 10_000))
        if buffer > 0:
            stream = stream.shuffle(seed=self.seed, buffer_size=buffer)
            stream.set_epoch(epoch)
        return split_dataset_by_node(stream, rank=self.rank, world_size=self.world_size)

    def _encode(self, docs: list[dict]) -> np.ndarray:
        texts = [
            d[self.text_field] for d in docs if d[self.text_field] and d[self.text_field].strip()
        ]
        ids = [tok + [self.eos_id] for tok in self.tokenizer.encode_batch(texts)]
        return np.fromiter((t for doc in ids for t in doc), dtype=np.int64)

    def train_batches(self):
        needed = self.micro_batch_size * self.window
        while True:
            docs = iter(self._documents(self.epoch).skip(self.docs_read))
            exhausted = False
            while not exhausted:
                while len(self.pending) < needed and not exhausted:
                    group = [d for _, d in zip(range(_DOCS_PER_READ), docs)]
                    exhausted = len(group) < _DOCS_PER_READ
                    if group:
                        self.pending = np.concatenate([self.pending, self._encode(group)])
                        self.docs_read += len(group)
                if len(self.pending) >= needed:
                    rows = self.pending[:needed].reshape(self.micro_batch_size, self.window)
                    self.pending = self.pending[needed:]
                    yield lm_batch(rows)
            if self.docs_read == 0:
                raise ValueError("the training stream of this rank holds no documents")
            self.epoch, self.docs_read = self.epoch + 1, 0

    def val_batches(self):
        if self._val is None:
            if self.has_val_split:
                docs = load_split(self.cfg, "validation", streaming=True)
            else:
                docs = load_split(self.cfg, "train", streaming=True).take(self.val_docs)
            tokens = self._encode(list(docs))
            self._val = fixed_windows(
                tokens,
                self.window,
                self.micro_batch_size,
                self.rank,
                self.world_size,
                self.cfg.get("val_max_batches"),
            )
        return self._val

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "docs_read": self.docs_read,
            "pending": self.pending.tolist(),
            "seed": self.seed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "world_size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"data state was saved with {key}={state[key]}, this run has "
                    f"{getattr(self, key)}; the stream resumes exactly only with the same {key}"
                )
        self.epoch, self.docs_read = int(state["epoch"]), int(state["docs_read"])
        self.pending = np.asarray(state["pending"], dtype=np.int64)
