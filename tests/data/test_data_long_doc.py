"""Long-document classification from local jsonl / csv records."""

import math

import pandas as pd
import pytest
import torch
from data_testing import write_jsonl

from flashtrain.data import build_data


def records(count=20):
    return [
        {"text": f"doc{i:02d} " + "word " * (10 + 7 * i), "label": ["spam", "ham", "eggs"][i % 3]}
        for i in range(count)
    ]


def config(tmp_path, path, **kw):
    return {
        "loader": "long_doc",
        "data_files": str(path),
        "cache_dir": str(tmp_path / "cache"),
        "num_classes": 3,
        "val_fraction": 0.2,
    } | kw


def test_truncated_documents_with_named_labels(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", records())
    module = build_data(config(tmp_path, path), seq_len=40, micro_batch_size=4, seed=0)
    assert (module.task, module.num_classes, module.vocab_size) == ("classification", 3, 258)
    assert module.class_names == ["eggs", "ham", "spam"]  # sorted names give the ids
    batch = next(module.train_batches())
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, 40)
    assert batch["labels"].shape == (4,) and batch["labels"].dtype == torch.int64
    texts = {r["text"].encode()[:40]: ["eggs", "ham", "spam"].index(r["label"]) for r in records()}
    for ids, mask, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        length = int(mask.sum())
        text = bytes(ids[:length].tolist())
        assert texts[text] == label  # the text and its label travel together
        assert (ids[length:] == 257).all()  # padded with <pad>


def test_chunk_mode_makes_one_example_per_chunk(tmp_path):
    df = pd.DataFrame({"body": [r["text"] for r in records()], "y": [i % 3 for i in range(20)]})
    df.to_csv(tmp_path / "docs.csv", index=False)
    cfg = config(
        tmp_path,
        tmp_path / "docs.csv",
        text_field="body",
        label_field="y",
        mode="chunk",
        max_chunks_per_doc=3,
    )
    module = build_data(cfg, seq_len=32, micro_batch_size=2, seed=0)
    total = sum(len(module.examples[s][1]) for s in ("train", "validation"))
    assert total == sum(min(3, math.ceil(len(r["text"]) / 32)) for r in records())


def test_missing_field_and_unknown_label_are_clear_errors(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"body": "x", "label": 0}] * 5)
    with pytest.raises(KeyError, match="no 'text' field"):
        build_data(config(tmp_path, path), seq_len=8, micro_batch_size=1, seed=0)
    path = write_jsonl(tmp_path / "docs2.jsonl", records())
    with pytest.raises(ValueError, match="not among the configured labels"):
        build_data(
            config(tmp_path, path, labels=["spam", "ham"]), seq_len=8, micro_batch_size=1, seed=0
        )
