"""Same weights, same results: flash (the Triton kernels through the interpreter, and the PyTorch
path) vs sdpa vs reference, loss and every gradient, for each architecture; dropout in the op."""

import pytest
import torch
from model_testing import TINY_BERT, TINY_CLASSIFIER, TINY_GPT2, grads

from flashtrain.models import AttentionContext, build_attention, build_model

IMPLS = [
    pytest.param(("flash", "triton"), id="flash-kernels"),
    pytest.param(("flash", "torch"), id="flash-torch"),
    pytest.param(("sdpa", "auto"), id="sdpa"),
]


def loss_and_grads(cfg, impl, route, batch, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(0)
    model = build_model(cfg, {"impl": impl})
    with torch.no_grad():  # larger than the 0.02 init so attention is far from uniform
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3 / p.shape[-1] ** 0.5)
    out = model(**batch)
    out.loss.backward()
    return out, grads(model)


def assert_same(a, b):
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a.loss, out_b.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(out_a.num_targets, out_b.num_targets)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=2e-6, msg=name)


def gpt2_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 48), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    return {"input_ids": ids, "labels": labels}


def bert_batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 97, (3, 40), generator=g)
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 29:] = 0
    mask[2, 9:] = 0
    labels = torch.full((3, 40), -100)
    pick = (torch.rand(3, 40, generator=g) < 0.3) & mask.bool()
    labels[pick] = ids[pick]
    types = torch.zeros_like(ids)
    types[:, 20:] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, "token_type_ids": types}


def classifier_batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (2, 64), generator=g)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[0, 50:] = 0
    return {"input_ids": ids, "labels": torch.tensor([0, 1]), "attention_mask": mask}


CASES = {
    "gpt2": (TINY_GPT2, gpt2_batch),
    "bert": (TINY_BERT, bert_batch),
    "classifier-cls": ({**TINY_CLASSIFIER, "pooling": "cls", "position": "1d"}, classifier_batch),
}


@pytest.mark.parametrize("arch", list(CASES))
@pytest.mark.parametrize("impl", IMPLS)
def test_same_loss_and_gradients_as_reference(arch, impl, monkeypatch):
    cfg, make_batch = CASES[arch]
    if arch == "classifier-cls" and impl[1] == "triton":
        cfg = {**cfg, "n_layer": 1}  # 65 tokens with the CLS token: keep the interpreter quick
    want = loss_and_grads(cfg, "reference", "auto", make_batch(), monkeypatch)
    got = loss_and_grads(cfg, *impl, make_batch(), monkeypatch)
    assert_same(got, want)


@pytest.mark.parametrize("impl", ["flash", "sdpa", "reference"])
def test_attention_dropout_goes_through_the_op(impl, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    torch.manual_seed(0)
    model = build_model({**TINY_GPT2, "attn_dropout": 0.3}, {"impl": impl})
    assert model.blocks[0].attn.attn_dropout == 0.3
    batch = gpt2_batch()

    def loss(seed):
        torch.manual_seed(seed)
        return model(**batch).loss

    a, b, c = loss(1), loss(1), loss(2)
    assert torch.equal(a, b)  # seeded from torch's generator
    assert not torch.equal(a, c)  # and a different mask each draw
    model.eval()  # no dropout at eval: the loss of a model built without it
    plain = build_model(TINY_GPT2, {"impl": impl}).eval()
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(loss(3), plain(**batch).loss)


@pytest.mark.parametrize("causal", [False, True])
def test_op_with_a_key_padding_mask_matches_across_impls(causal, monkeypatch):
    """An attention impl on a padded (B, T, H, D) layout with a key-padding mask: flash unpads, runs the
    varlen kernel and pads back; sdpa and reference mask the keys. Same output at real tokens."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 24, 2, 16, generator=g) for _ in range(3))
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[0, 17:] = False
    ctx = AttentionContext(causal=causal, key_padding_mask=mask)
    outs = {impl: build_attention(impl)(q, k, v, ctx) for impl in ("flash", "sdpa", "reference")}
    for impl in ("flash", "sdpa"):
        torch.testing.assert_close(outs[impl][mask], outs["reference"][mask], rtol=1e-5, atol=1e-6)
    assert outs["flash"][0, 17:].abs().max() == 0
    if not causal:  # (causal with right padding never reaches the padded keys anyway)
        unmasked = build_attention("reference")(q, k, v, AttentionContext())
        assert (unmasked[0, :17] - outs["reference"][0, :17]).abs().max() > 1e-3
