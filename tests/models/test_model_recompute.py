"""Recomputation of whole blocks: the same gradients as without, and less memory (CPU meter)."""

import pytest
import torch
from model_testing import TINY_BERT, TINY_GPT2, PeakMemory, grads

from flashtrain.models import build_model

MODES = [("none", 1), ("all", 1), ("every_k", 2)]


def run(cfg, impl, recompute, every, batch, seed=0):
    torch.manual_seed(seed)
    model = build_model({**cfg, "recompute": recompute, "recompute_every": every}, {"impl": impl})
    torch.manual_seed(seed + 1)  # dropout draws
    out = model(**batch)
    out.loss.backward()
    return model, out.loss.detach(), grads(model)


@pytest.mark.parametrize("impl", ["sdpa", "flash"])
def test_recompute_gives_identical_gradients_with_dropout(impl, monkeypatch):
    """Dropout everywhere (attention dropout inside the op): recomputation replays the same
    random masks (checkpoint restores the RNG state), so gradients are bitwise equal."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    cfg = {**TINY_GPT2, "n_layer": 4, "dropout": 0.1, "attn_dropout": 0.1}
    ids = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    results = {mode: run(cfg, impl, mode, k, batch) for mode, k in MODES}
    model, loss, ref = results["none"]
    assert [model.recomputes_block(i) for i in range(4)] == [False] * 4
    assert [results["every_k"][0].recomputes_block(i) for i in range(4)] == [True, False] * 2
    for mode in ("all", "every_k"):
        _, loss_m, grads_m = results[mode]
        assert torch.equal(loss_m, loss)
        assert grads_m.keys() == ref.keys()
        for name in ref:
            assert torch.equal(grads_m[name], ref[name]), (mode, name)
    # and dropout is really on: another seed gives other gradients
    _, _, other = run(cfg, impl, "none", 1, batch, seed=0 + 10)
    assert not torch.equal(other["blocks.0.attn.c_attn.weight"], ref["blocks.0.attn.c_attn.weight"])


@pytest.mark.parametrize("impl", ["sdpa", "flash"])  # flash: packed varlen tokens through blocks
def test_recompute_bert_with_padding(impl, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    ids = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = torch.where((torch.arange(32) % 3 == 0) & mask.bool(), ids, -100)
    batch = {"input_ids": ids, "labels": labels, "attention_mask": mask}
    _, loss, ref = run(TINY_BERT, impl, "none", 1, batch)
    _, loss_all, got = run(TINY_BERT, impl, "all", 1, batch)
    assert torch.equal(loss, loss_all)
    for name in ref:
        assert torch.equal(got[name], ref[name]), name


def test_recompute_lowers_peak_memory():
    """A small GPT-2 at a long sequence (4 layers, width 64, 1024 tokens): peak tensor memory of a
    training step measured on CPU. Recomputing every block keeps only block inputs alive."""
    cfg = {**TINY_GPT2, "n_layer": 4, "max_seq_len": 1024}
    ids = torch.randint(0, 97, (1, 1024), generator=torch.Generator().manual_seed(2))
    peaks, after_forward = {}, {}
    for mode, k in MODES:
        torch.manual_seed(0)
        model = build_model({**cfg, "recompute": mode, "recompute_every": k}, {"impl": "sdpa"})
        with PeakMemory() as meter:
            out = model(input_ids=ids, labels=ids)
            after_forward[mode] = meter.current()
            out.loss.backward()
        peaks[mode] = meter.peak
    assert after_forward["all"] < 0.2 * after_forward["none"], after_forward
    assert after_forward["all"] < after_forward["every_k"] < after_forward["none"], after_forward
    assert peaks["all"] < 0.6 * peaks["none"], peaks
    assert peaks["all"] < peaks["every_k"] < peaks["none"], peaks
