"""Language-model batches from a token cache: contiguous windows of seq_len + 1 tokens.

Each epoch cuts the training tokens into disjoint windows starting at a seeded random shift (so
window boundaries move between epochs), shuffles them and deals them to the ranks (no overlap).
Validation uses fixed windows from the start of the validation tokens.
"""

from __future__ import annotations

import numpy as np

from flashtrain.data.config import LMCorpusConfig, cache_root, check_vocab_size
from flashtrain.data.corpus import open_corpus, prepared_summary
from flashtrain.data.lm_batches import fixed_windows, gather_windows, lm_batch
from flashtrain.data.lm_stream import StreamingLM  # one-way: it never imports this module
from flashtrain.data.module import DataModule, DataRun, SampledDataModule
from flashtrain.data.sampling import EpochSampler, epoch_rng
from flashtrain.data.stream_identity import token_file_identity
from flashtrain.data.tokenization import build_tokenizer


class TokenCacheLM(SampledDataModule):
    """task 'lm' over a prepared token cache (see corpus.py); eos_id and the document starts
    (`doc_starts` of each split) are exposed for packed / varlen training."""

    Config = LMCorpusConfig  # its schema (configs/data/*.yaml with loader: lm_corpus)

    @classmethod
    def for_config(cls, cfg: LMCorpusConfig) -> type[DataModule]:
        """data.streaming: true reads and tokenizes on the fly instead (lm_stream.py)."""
        return StreamingLM if cfg.streaming else cls

    task = "lm"
    num_classes = None

    def __init__(self, cfg: LMCorpusConfig, run: DataRun):
        super().__init__(run)
        self.tokenizer = build_tokenizer(cfg, cache_root(cfg))
        self.vocab_size = check_vocab_size(cfg, self.tokenizer.vocab_size, self.tokenizer.name)
        self.eos_id = self.tokenizer.eos_id
        # document masking: cut the windows at EOS (only where the corpus has EOS separators)
        self.document_masking = bool(
            cfg.document_masking and cfg.eos_policy == "append" and self.eos_id is not None
        )
        self.splits = open_corpus(
            cfg, self.tokenizer, eos_policy=cfg.eos_policy, progress=self.rank == 0
        )
        self.train_tokens = self.splits["train"].tokens
        self.window = self.seq_len + 1
        self._shifts: dict[int, int] = {}
        if len(self.train_tokens) < self.window * self.world_size:
            raise ValueError(
                f"training split has {len(self.train_tokens)} tokens: too few for "
                f"{self.world_size} rank(s) x one window of seq_len + 1 = {self.window}"
            )
        self.sampler = EpochSampler(
            lambda epoch: (len(self.train_tokens) - self.shift(epoch)) // self.window,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
        )

    @classmethod
    def prepare(cls, cfg: LMCorpusConfig, *, progress: bool = True) -> dict:
        tokenizer = build_tokenizer(cfg, cache_root(cfg))
        files = open_corpus(cfg, tokenizer, eos_policy=cfg.eos_policy, progress=progress)
        return prepared_summary(files, tokenizer)

    def shift(self, epoch: int) -> int:
        """Where epoch's first window starts: random in [0, window) when the data allows."""
        if epoch not in self._shifts:
            slack = len(self.train_tokens) - self.window * self.world_size
            rng = epoch_rng(self.seed, epoch, purpose=1)
            self._shifts[epoch] = int(rng.integers(min(self.window, slack + 1)))
        return self._shifts[epoch]

    def identity_fields(self) -> dict:
        return {
            "data.streaming": False,
            "corpus": token_file_identity(self.splits["train"]),
            "data.tokenizer": self.tokenizer.name,
            "data.document_masking": self.document_masking,
        }

    def make_batch(self, epochs, items):
        shifts = np.array([self.shift(int(e)) for e in epochs], dtype=np.int64)
        starts = shifts + items * self.window
        rows = gather_windows(self.train_tokens, starts, self.window)
        return lm_batch(self.splits["train"].check_ids(rows), self.masking_eos_id)

    def val_batches(self):
        return fixed_windows(
            self.splits["validation"].tokens,
            self.window,
            self.micro_batch_size,
            self.rank,
            self.world_size,
            self.eval_batches,
            self.splits["validation"].check_ids,
            self.masking_eos_id,
        )

    @property
    def masking_eos_id(self) -> int | None:
        """The EOS id batches are cut at (data.document_masking), or None."""
        return self.eos_id if self.document_masking else None
