"""Streaming LM corpora (larger than the disk): exact resume and disjoint ranks."""

import itertools
import random

import pytest
import torch
from data_testing import lm_config, random_text, write_jsonl

from flashtrain.data import build_data


def make(cfg, rank=0, world_size=1, eval_batches=1):
    return build_data(
        cfg,
        seq_len=24,
        micro_batch_size=2,
        seed=3,
        rank=rank,
        world_size=world_size,
        eval_batches=eval_batches,
    )


def test_streaming_resume_is_exact_even_with_a_shuffle_buffer(tmp_path):
    cfg = lm_config(tmp_path, streaming=True, shuffle_buffer=4)
    module = make(cfg)
    stream = module.train_batches()
    # Run past the end of the first epoch (7 documents of ~1 kB = ~150 windows of 25 tokens).
    for _ in range(170):
        next(stream)
    state = module.state_dict()
    expected = list(itertools.islice(stream, 4))
    resumed = make(cfg)
    resumed.load_state_dict(state)
    got = list(itertools.islice(resumed.train_batches(), 4))
    assert state["epoch"] >= 1
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(expected, got))


def test_a_rank_resumes_its_own_stream_where_files_do_not_divide_between_ranks(tmp_path):
    """3 files for 2 ranks: `datasets` splits them by documents, and a skip() of the rank's
    documents already read would skip in the stream of both ranks, so the resumed rank read
    half of them again. Resumed past two reads of 64 documents, it goes on exactly."""
    rng = random.Random(0)
    (tmp_path / "corpus").mkdir()
    for f in range(3):
        docs = [{"text": random_text(rng, 8)} for _ in range(100)]
        write_jsonl(tmp_path / "corpus" / f"part{f}.jsonl", docs)
    cfg = lm_config(tmp_path, data_files=str(tmp_path / "corpus" / "*.jsonl"), streaming=True)
    module = make(cfg, rank=1, world_size=2)
    stream = module.train_batches()
    for _ in range(100):
        next(stream)
    state = module.state_dict()
    assert state["docs_read"] == 128 and state["epoch"] == 0
    expected = list(itertools.islice(stream, 60))  # 3000 tokens: into the rank's next read
    resumed = make(cfg, rank=1, world_size=2)
    resumed.load_state_dict(state)
    got = list(itertools.islice(resumed.train_batches(), 60))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(expected, got))


def test_streaming_ranks_read_different_documents_and_validation_is_held_out(tmp_path):
    cfg = lm_config(tmp_path, streaming=True, shuffle_buffer=0)
    rows = []
    for rank in range(2):
        batch = next(make(cfg, rank, 2).train_batches())
        assert batch["input_ids"].shape == (2, 24)
        rows.append(tuple(batch["input_ids"][0].tolist()))
    assert rows[0] != rows[1]
    # Validation = the first documents (files in sorted order), as many as eval_batches take:
    # one batch of 2 x 25 tokens fits in the first document; training starts at the second.
    texts = [p.read_text() for p in sorted((tmp_path / "corpus").glob("*.txt"))]
    module = make(cfg)
    val = [b["input_ids"] for b in module.val_batches()]
    assert len(val) == 1 and all(
        torch.equal(a, b["input_ids"]) for a, b in zip(val, module.val_batches())
    )
    assert val[0][0].tolist() == list(texts[0].encode()[:24])
    train_first = next(module.train_batches())["input_ids"][0]
    assert train_first.tolist() == list(texts[1].encode()[:24])
    # More evaluation holds out more documents: 16 batches x 2 x 25 = 800 tokens take two.
    assert len(texts[0].encode()) + 1 < 800 <= len(texts[0].encode()) + len(texts[1].encode()) + 2
    more = make(cfg, eval_batches=16)
    assert more.held_out_docs == 2
    assert next(more.train_batches())["input_ids"][0].tolist() == list(texts[2].encode()[:24])
    with pytest.raises(ValueError, match="held_out_docs=2, this run has 1"):
        module.load_state_dict(more.state_dict())
    with pytest.raises(ValueError, match="set trainer.eval_batches"):
        make(cfg, eval_batches=None)
