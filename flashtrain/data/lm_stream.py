"""Language-model batches streamed from a corpus larger than the disk (`streaming: true`).

Documents are read lazily with `datasets` streaming, split across ranks (split_dataset_by_node),
optionally shuffled through a seeded buffer, tokenized on the fly, joined with EOS and cut into
windows of seq_len + 1 tokens. The position is (epoch, documents read by this rank, tokens read
but not yet emitted), so resuming replays the same seeded stream to exactly that point.

Validation is the source's own split; without one, the first documents of the training source
are held out, as many as eval_batches validation batches on every rank take.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np

from flashtrain.data.config import LMCorpusConfig, cache_root, check_vocab_size
from flashtrain.data.corpus import load_split, read_documents, resolve_local_files
from flashtrain.data.lm_batches import fixed_windows, lm_batch
from flashtrain.data.module import DataModule, DataRun
from flashtrain.data.sampling import check_same_stream
from flashtrain.data.stream_identity import IDENTITY_KEY, check_same_data, short_hash
from flashtrain.data.tokenization import build_tokenizer, no_eos_error

_DOCS_PER_READ = 64  # documents tokenized together


class StreamingLM(DataModule):
    Config = LMCorpusConfig  # loader: lm_corpus with streaming: true (TokenCacheLM.for_config)

    task = "lm"
    num_classes = None

    def __init__(self, cfg: LMCorpusConfig, run: DataRun):
        super().__init__(run)
        self.cfg = cfg
        self.tokenizer = build_tokenizer(cfg, cache_root(cfg))
        if self.tokenizer.eos_id is None:
            raise no_eos_error(self.tokenizer, "streamed documents are joined with it")
        self.vocab_size = check_vocab_size(cfg, self.tokenizer.vocab_size, self.tokenizer.name)
        self.eos_id = self.tokenizer.eos_id
        self.document_masking = cfg.document_masking  # documents are always EOS-separated here
        self.masking_eos_id = self.eos_id if self.document_masking else None
        self.window = self.seq_len + 1
        self.has_val_split = load_split(cfg, "validation", streaming=True) is not None
        if not self.has_val_split and self.eval_batches is None:
            raise ValueError(
                f"'{cfg.name}' has no validation split, so its first documents are held out, as "
                "many as the evaluation takes: set trainer.eval_batches to a number"
            )
        self.epoch, self.docs_read = 0, 0
        self.pending = np.empty(0, dtype=np.int64)  # tokens read but not yet emitted
        self._held_out: tuple[int, np.ndarray] | None = None
        self._val = None

    def held_out(self) -> tuple[int, np.ndarray]:
        """(documents, their tokens) held out from the start of the training source: whole
        documents until they fill eval_batches batches on every rank."""
        if self._held_out is None:
            needed = self.eval_batches * self.micro_batch_size * self.world_size * self.window
            docs = read_documents(self.cfg, "train", load_split(self.cfg, "train", streaming=True))
            pieces: list[np.ndarray] = []
            total = 0
            while total < needed:
                group = list(itertools.islice(docs, _DOCS_PER_READ))
                if not group:
                    raise ValueError(
                        f"'{self.cfg.name}' holds fewer than the {needed} tokens that "
                        f"trainer.eval_batches={self.eval_batches} validation batches take"
                    )
                for ids in self._encode_each(group):
                    pieces.append(ids)
                    total += len(ids)
                    if total >= needed:
                        break
            self._held_out = (len(pieces), np.concatenate(pieces))
        return self._held_out

    def _documents(self, epoch: int):
        """This rank's document stream for `epoch` (the held-out documents left out)."""
        from datasets.distributed import split_dataset_by_node

        stream = load_split(self.cfg, "train", streaming=True)
        if not self.has_val_split:
            stream = stream.skip(self.held_out()[0])
        buffer = self.cfg.shuffle_buffer
        if buffer > 0:
            stream = stream.shuffle(seed=self.seed, buffer_size=buffer)
            stream.set_epoch(epoch)
        return split_dataset_by_node(stream, rank=self.rank, world_size=self.world_size)

    def _encode_each(self, docs: list[dict]) -> list[np.ndarray]:
        """Per document: its ids followed by EOS (int64); empty documents give no tokens."""
        field = self.cfg.text_field
        texts = [d[field] if d[field] and d[field].strip() else "" for d in docs]
        encoded = iter(self.tokenizer.encode_batch([t for t in texts if t]))
        empty = np.empty(0, dtype=np.int64)
        return [np.asarray(next(encoded) + [self.eos_id], np.int64) if t else empty for t in texts]

    def _encode(self, docs: list[dict]) -> np.ndarray:
        return np.concatenate([np.empty(0, dtype=np.int64), *self._encode_each(docs)])

    def train_batches(self):
        needed = self.micro_batch_size * self.window
        while True:
            # This rank's documents already read are passed over here, not with the stream's
            # skip(): `datasets` applies split_dataset_by_node after a later skip, so that skips
            # in the stream of all ranks, and a rank resumed re-reads its own documents.
            docs = itertools.islice(
                read_documents(self.cfg, "train", self._documents(self.epoch)), self.docs_read, None
            )
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
                    yield lm_batch(rows, self.masking_eos_id)
            if self.docs_read == 0:
                raise ValueError("the training stream of this rank holds no documents")
            self.epoch, self.docs_read = self.epoch + 1, 0

    def val_batches(self):
        if self._val is None:
            if self.has_val_split:
                stream = load_split(self.cfg, "validation", streaming=True)
                tokens = self._encode(list(read_documents(self.cfg, "validation", stream)))
            else:
                tokens = self.held_out()[1]
            self._val = fixed_windows(
                tokens,
                self.window,
                self.micro_batch_size,
                self.rank,
                self.world_size,
                self.eval_batches,
                eos_id=self.masking_eos_id,
            )
        return self._val

    @property
    def held_out_docs(self) -> int:
        """Documents the training stream skips (0 with a validation split)."""
        return 0 if self.has_val_split else self.held_out()[0]

    def identity_fields(self) -> dict:
        return {
            "data.streaming": True,
            "corpus": source_identity(self.cfg),  # read lazily: identified by where it is
            "data.tokenizer": self.tokenizer.name,
            "data.document_masking": self.document_masking,
            "data.shuffle_buffer": self.cfg.shuffle_buffer,
        }

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "docs_read": self.docs_read,
            "pending": self.pending.tolist(),
            "seed": self.seed,
            "world_size": self.world_size,
            "held_out_docs": self.held_out_docs,  # depends on trainer.eval_batches
            IDENTITY_KEY: self.data_identity,
        }

    def load_state_dict(self, state: dict) -> None:
        check_same_data(state, self.data_identity)
        check_same_stream(state, self, ("seed", "world_size", "held_out_docs"))
        self.epoch, self.docs_read = int(state["epoch"]), int(state["docs_read"])
        self.pending = np.asarray(state["pending"], dtype=np.int64)


def source_identity(cfg: LMCorpusConfig) -> str:
    """A streamed corpus by its source: the local files' names and sizes (not their folder, so a
    moved corpus is the same one), or the hub dataset, and the text field read."""
    if cfg.data_files:
        files = {
            key: [(Path(f).name, os.path.getsize(f)) for f in resolve_local_files(patterns)]
            for key, patterns in (("data_files", cfg.data_files), ("val_files", cfg.val_files))
            if patterns
        }
        count = len(files["data_files"])
        return f"{count} local files, sha256 {short_hash([files, cfg.sample_by, cfg.text_field])}"
    hub = [cfg.hub_name, cfg.hub_config, cfg.train_split, cfg.val_split, cfg.text_field]
    return f"{cfg.hub_name} ({cfg.hub_config or 'default'}), sha256 {short_hash(hub)}"
