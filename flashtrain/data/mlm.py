"""BERT pre-training batches: sequence pairs from a token cache, masked as in BERT.

The tokenizer must have [CLS] / [SEP] / [MASK] / [PAD]: WordPiece (data=bert_mlm), or UTF-8 bytes
with those four appended as ids 256..259 (data.tokenizer=byte_mlm; data=pysrc_mlm). Only the
tokens of A and B are ever chosen for prediction (never [CLS], [SEP] or padding), and a "random
token" replacement draws from the vocabulary minus its special ids (for bytes: the 256 bytes).

Each document is cut into pieces of at most seq_len - 3 tokens (room for [CLS] A [SEP] B [SEP]).
An instance takes one piece, shortened to a random length with probability short_seq_prob, and
splits it at a random point into segments A and B (B continues A; there is no next-sentence task).
Shorter instances are padded (attention_mask 0, never masked). The split, the shortening and the
mask come from the instance's own seeded stream, which includes the epoch when dynamic_masking is
on (a new mask every epoch, as RoBERTa) and leaves it out otherwise (one fixed mask per instance,
as in the pre-masked data of the MLPerf BERT benchmark).

preset "mlperf": seq_len 512, at most 76 predictions per sequence, 10% short sequences, fixed
masks (the MLPerf BERT-large reference settings).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from flashtrain.data.config import MLMConfig, cache_root, check_vocab_size
from flashtrain.data.corpus import open_corpus, prepared_summary
from flashtrain.data.mlm_corruption import mask_tokens
from flashtrain.data.module import DataRun, EvalBatches, SampledDataModule, eval_items
from flashtrain.data.sampling import EpochSampler
from flashtrain.data.stream_identity import token_file_identity
from flashtrain.data.tokenization import build_tokenizer
from flashtrain.typed_config import check_choice

PRESETS = {
    "default": {},
    "mlperf": {
        "seq_len": 512,
        "mask_prob": 0.15,
        "max_predictions_per_seq": 76,
        "short_seq_prob": 0.1,
        "dynamic_masking": False,
    },
}


def document_pieces(doc_starts: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut documents (doc_starts (D + 1,)) into consecutive pieces of at most max_tokens tokens.

    Returns piece starts and lengths (P,); pieces shorter than 2 tokens (no room for A and B) are
    dropped.
    """
    starts = np.asarray(doc_starts, dtype=np.int64)
    lengths = np.diff(starts)
    counts = -(-lengths // max_tokens)  # ceil
    doc = np.repeat(np.arange(len(lengths)), counts)
    within = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)
    piece_start = starts[doc] + within * max_tokens
    piece_len = np.minimum(max_tokens, starts[doc + 1] - piece_start)
    keep = piece_len >= 2
    return piece_start[keep], piece_len[keep]


class MaskedLM(SampledDataModule):
    Config = MLMConfig  # its schema (configs/data/*.yaml with loader: mlm)

    task = "mlm"
    num_classes = None
    pads_sequences = True  # short instances are padded to seq_len

    def __init__(self, cfg: MLMConfig, run: DataRun):
        super().__init__(run)
        preset = dict(PRESETS[cfg.preset])  # check_run_settings: a known one, its seq_len
        preset.pop("seq_len", None)
        cfg = dataclasses.replace(cfg, **preset)
        seq_len = self.seq_len
        self.tokenizer = self.mlm_tokenizer(cfg)
        self.vocab_size = check_vocab_size(cfg, self.tokenizer.vocab_size, self.tokenizer.name)
        self.splits = open_corpus(cfg, self.tokenizer, eos_policy="none", progress=self.rank == 0)
        self.mask_prob = cfg.mask_prob
        self.max_predictions = cfg.max_predictions_per_seq
        self.short_seq_prob = cfg.short_seq_prob
        self.dynamic = cfg.dynamic_masking
        self.random_ids = np.setdiff1d(
            np.arange(self.tokenizer.vocab_size), self.tokenizer.special_ids
        )
        self.pieces = {
            split: document_pieces(tf.doc_starts, seq_len - 3) for split, tf in self.splits.items()
        }
        self.sampler = EpochSampler(
            len(self.pieces["train"][0]), seed=self.seed, rank=self.rank, world_size=self.world_size
        )

    @classmethod
    def check_run_settings(cls, cfg: MLMConfig, *, seq_len: int, eval_batches: int | None) -> None:
        """A known data.preset, the seq_len it needs, and room for [CLS] A [SEP] B [SEP]."""
        check_choice(cfg.preset, tuple(PRESETS), "data.preset")
        needed_seq_len = PRESETS[cfg.preset].get("seq_len")
        if needed_seq_len is not None and needed_seq_len != seq_len:
            raise ValueError(
                f"data.preset={cfg.preset} needs seq_len={needed_seq_len}, got {seq_len}"
            )
        if seq_len < 5:
            raise ValueError(
                f"seq_len={seq_len} leaves no room for the masked-LM pairs [CLS] A [SEP] B [SEP] "
                f"of data '{cfg.name}': seq_len must be >= 5"
            )

    @staticmethod
    def mlm_tokenizer(cfg: MLMConfig):
        tok = build_tokenizer(cfg, cache_root(cfg))
        if tok.mask_id is None or tok.cls_id is None:
            raise ValueError(
                f"MLM needs a tokenizer with [CLS]/[SEP]/[MASK]/[PAD]: data.tokenizer=wordpiece "
                f"or byte_mlm; got '{tok.name}'"
            )
        return tok

    @classmethod
    def prepare(cls, cfg: MLMConfig, *, progress: bool = True) -> dict:
        tokenizer = cls.mlm_tokenizer(cfg)
        files = open_corpus(cfg, tokenizer, eos_policy="none", progress=progress)
        return prepared_summary(files, tokenizer)

    def identity_fields(self) -> dict:
        return {
            "corpus": token_file_identity(self.splits["train"]),
            "data.tokenizer": self.tokenizer.name,
        }

    def instance(self, split: str, piece: int, rng: np.random.Generator, shorten: bool):
        """(ids (T,), token_type_ids (T,), maskable (T,)) for one piece, padded to seq_len."""
        start, length = (int(a[piece]) for a in self.pieces[split])
        if shorten and length > 2 and rng.random() < self.short_seq_prob:
            length = int(rng.integers(2, length + 1))
        piece = self.splits[split].check_ids(self.splits[split].tokens[start : start + length])
        tokens = np.asarray(piece, dtype=np.int64)
        cut = int(rng.integers(1, length))
        t = self.tokenizer
        ids = np.full(self.seq_len, t.pad_id, dtype=np.int64)
        types = np.zeros(self.seq_len, dtype=np.int64)
        maskable = np.zeros(self.seq_len, dtype=bool)
        a, b = tokens[:cut], tokens[cut:]
        ids[: length + 3] = np.concatenate([[t.cls_id], a, [t.sep_id], b, [t.sep_id]])
        types[cut + 2 : length + 3] = 1  # B and its [SEP]
        maskable[1 : cut + 1] = True
        maskable[cut + 2 : length + 2] = True
        return ids, types, maskable

    def batch(self, split: str, epochs, pieces, shorten: bool, purpose: int):
        rows = []
        for epoch, piece in zip(epochs.tolist(), pieces.tolist()):
            key = (purpose, epoch if self.dynamic else 0, piece)
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key))
            ids, types, maskable = self.instance(split, piece, rng, shorten)
            corrupted, labels = mask_tokens(
                ids[None],
                maskable[None],
                rng,
                mask_id=self.tokenizer.mask_id,
                random_ids=self.random_ids,
                mask_prob=self.mask_prob,
                max_predictions=self.max_predictions,
            )
            rows.append((corrupted[0], types, ids != self.tokenizer.pad_id, labels[0]))
        ids, types, attention, labels = (torch.from_numpy(np.stack(c)) for c in zip(*rows))
        return {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": attention.to(torch.int64),
            "labels": labels,
        }

    def make_batch(self, epochs, items):
        return self.batch("train", epochs, items, shorten=True, purpose=0)

    def val_batches(self):
        count = len(self.pieces["validation"][0])
        mine = eval_items(count, self.rank, self.world_size, "MLM validation")
        return EvalBatches(
            lambda items: self.batch(
                "validation", np.zeros(len(items), dtype=np.int64), items, shorten=False, purpose=1
            ),
            mine,
            self.micro_batch_size,
            self.eval_batches,
        )
