"""Long-document classification (MIMIC-III / ECtHR style) from local jsonl or csv files.

Each record has a text field and a label field. Labels are integers in [0, num_classes), or
names: listed in `labels` (that order gives the ids) or else sorted. Documents are tokenized and
either truncated to seq_len (mode: truncate) or cut into up to max_chunks_per_doc chunks of seq_len
tokens that each carry the document's label (mode: chunk). Short examples are padded and get
attention_mask 0 there.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from flashtrain.data.config import LongDocConfig, cache_root, check_vocab_size
from flashtrain.data.corpus import train_val_splits
from flashtrain.data.module import DataRun, EvalBatches, SampledDataModule, eval_items
from flashtrain.data.sampling import EpochSampler
from flashtrain.data.tokenization import build_tokenizer


def label_ids(values: list, names: list | None, num_classes: int) -> tuple[np.ndarray, list]:
    """Label values (ints or names) -> int64 ids and the class names in id order."""
    if names is None and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values
    ):
        ids = np.asarray(values, dtype=np.int64)
        names = [str(i) for i in range(num_classes)]
    else:
        names = list(names) if names is not None else sorted({str(v) for v in values})
        index = {name: i for i, name in enumerate(names)}
        unknown = sorted({str(v) for v in values} - set(index))
        if unknown:
            raise ValueError(f"labels {unknown[:5]} are not among the configured labels {names}")
        ids = np.asarray([index[str(v)] for v in values], dtype=np.int64)
    if len(names) > num_classes or (len(ids) and (ids.min() < 0 or ids.max() >= num_classes)):
        raise ValueError(
            f"labels need {max(len(names), int(ids.max()) + 1)} classes; data.num_classes={num_classes}"
        )
    return ids, names


def cut_examples(
    docs: list[list[int]], labels: np.ndarray, seq_len: int, mode: str, max_chunks: int
):
    """(token lists, labels) of the examples: truncated documents or their seq_len chunks."""
    examples, example_labels = [], []
    for ids, label in zip(docs, labels.tolist()):
        pieces = (
            [ids[:seq_len]]
            if mode == "truncate"
            else [ids[i : i + seq_len] for i in range(0, max(len(ids), 1), seq_len)][:max_chunks]
        )
        examples.extend(pieces)
        example_labels.extend([label] * len(pieces))
    return examples, np.asarray(example_labels, dtype=np.int64)


class LongDocClassification(SampledDataModule):
    Config = LongDocConfig  # its schema (configs/data/*.yaml with loader: long_doc)

    task = "classification"
    pads_sequences = True  # documents shorter than seq_len are padded

    def __init__(self, cfg: LongDocConfig, run: DataRun):
        super().__init__(run)  # cfg names its data_files: build_data checks (check_data_source)
        self.num_classes = cfg.num_classes
        self.tokenizer = build_tokenizer(cfg, cache_root(cfg))
        if self.tokenizer.pad_id is None:
            raise ValueError(f"tokenizer '{self.tokenizer.name}' has no padding token")
        self.vocab_size = check_vocab_size(cfg, self.tokenizer.vocab_size, self.tokenizer.name)
        self.examples, names = {}, cfg.labels
        for split, dataset in zip(("train", "validation"), train_val_splits(cfg)):
            for field in (cfg.text_field, cfg.label_field):
                if field not in dataset.column_names:
                    raise KeyError(f"records have no '{field}' field (have {dataset.column_names})")
            ids, names = label_ids(dataset[cfg.label_field], names, self.num_classes)
            docs = self.tokenizer.encode_batch([str(t) for t in dataset[cfg.text_field]])
            self.examples[split] = cut_examples(
                docs, ids, self.seq_len, cfg.mode, cfg.max_chunks_per_doc
            )
        self.class_names = names
        self.sampler = EpochSampler(
            len(self.examples["train"][1]),
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
        )

    @classmethod
    def prepare(cls, cfg: LongDocConfig, *, progress: bool = True) -> dict:
        train, val = train_val_splits(cfg)
        return {"train_documents": len(train), "validation_documents": len(val)}

    def identity_fields(self) -> dict:
        """The training examples by content (their tokens, lengths and labels)."""
        tokens, labels = self.examples["train"]
        digest = hashlib.sha256(labels.tobytes())
        for example in tokens:  # each prefixed by its length: the split points count too
            digest.update(len(example).to_bytes(8, "little"))
            digest.update(np.asarray(example, dtype=np.int64).tobytes())
        corpus = f"{len(labels)} examples, sha256 {digest.hexdigest()[:12]}"
        return {"corpus": corpus, "data.tokenizer": self.tokenizer.name}

    def batch(self, split: str, items) -> dict[str, torch.Tensor]:
        tokens, labels = self.examples[split]
        ids = np.full((len(items), self.seq_len), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), self.seq_len), dtype=np.int64)
        for row, item in enumerate(items.tolist()):
            ids[row, : len(tokens[item])] = tokens[item]
            mask[row, : len(tokens[item])] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels[items]),
            "attention_mask": torch.from_numpy(mask),
        }

    def make_batch(self, epochs, items):
        return self.batch("train", items)

    def val_batches(self):
        count = len(self.examples["validation"][1])
        mine = eval_items(count, self.rank, self.world_size, "long_doc validation")
        return EvalBatches(
            lambda items: self.batch("validation", items),
            mine,
            self.micro_batch_size,
            self.eval_batches,
        )
