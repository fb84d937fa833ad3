"""flashtrain's Llama is transformers' LlamaForCausalLM (MistralForCausalLM with a sliding
window): the same logits, loss and every gradient from the same random weights. float64 through
our reference / sdpa attention to ~1e-12; float32 through the flash kernels (both CPU routes:
the Triton kernels under the interpreter and the PyTorch path) to float32 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from llama_testing import (  # noqa: F401 (a fixture)
    TINY_LLAMA,
    hf_norm_in_input_dtype,
    hf_state_names,
    hf_twin,
    tiny_llama,
)

from flashtrain.models import build_model

VOCAB = TINY_LLAMA["vocab_size"]
# transformers' RMSNorm computing in float64 for the float64 comparisons (llama_testing.py)
pytestmark = pytest.mark.usefixtures("hf_norm_in_input_dtype")


def _batch(seed: int, batch: int = 2, seqlen: int = 37):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seqlen), generator=g)
    labels = torch.randint(0, VOCAB, (batch, seqlen), generator=g)
    labels[0, :5] = -100
    return ids, labels


def _ours(model, ids, labels):
    """(logits, loss, grads by transformers' names) of our model."""
    model.zero_grad()
    out = model(ids, labels)
    out.loss.backward()
    with torch.no_grad():
        logits = model.logits(ids)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits, out.loss.detach(), grads


def _theirs(hf, ids, labels):
    hf.zero_grad()
    logits = hf(input_ids=ids).logits  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    grads = {}
    for name, p in hf.named_parameters():
        grads[hf_state_names(name)] = p.grad.clone()
    return logits.detach(), loss.detach(), grads


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _check_all(ours, theirs, tol):
    (lo, lso, go), (lt, lst, gt) = ours, theirs
    assert _rel(lo, lt) < tol, "logits"
    assert abs(float(lso) - float(lst)) < tol * abs(float(lst)), "loss"
    if "lm_head.weight" not in go:  # tied: transformers' two names share one tensor's gradient
        gt.pop("lm_head.weight", None)
    assert go.keys() == gt.keys()
    for name in go:
        assert _rel(go[name], gt[name]) < tol, name


CONFIGS = {
    "gqa": {},
    "mha-tied": dict(n_kv_head=4, tie_embeddings=True),
    "mqa": dict(n_kv_head=1, d_ff=None, multiple_of=32, ffn_dim_multiplier=None),
    "linear": dict(rope_scaling=dict(type="linear", factor=4.0)),
    "llama3": dict(
        rope_scaling=dict(
            type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_seq_len=16,
        ),
        rope_theta=500000.0,
    ),
    "dynamic": dict(rope_scaling=dict(type="dynamic", factor=2.0, original_max_seq_len=16)),
    "yarn": dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_seq_len=16)),
    "mistral-window": dict(sliding_window=9),
}


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_float64_equals_transformers(name, impl):
    if impl == "sdpa" and name != "gqa" and name != "mistral-window":
        pytest.skip("sdpa: the GQA and window cases suffice (the rest is the same model code)")
    torch.manual_seed(0)
    model = tiny_llama(impl, **CONFIGS[name])
    hf = hf_twin(model)
    ids, labels = _batch(1)
    _check_all(_ours(model, ids, labels), _theirs(hf, ids, labels), tol=1e-12)


def test_mqa_width_follows_metas_rule():
    model = tiny_llama(**CONFIGS["mqa"])
    # 2/3 of 4 * 64 = 170, rounded up to a multiple of 32
    assert model.config.d_ff == 192 and model.blocks[0].mlp.up_proj.weight.shape == (192, 64)
    assert model.blocks[0].self_attn.k_proj.weight.shape == (16, 64)


def test_window_changes_the_model():
    """So the Mistral comparison above says something: the window is felt at this length."""
    torch.manual_seed(0)
    windowed = tiny_llama(**CONFIGS["mistral-window"])
    full = build_model(TINY_LLAMA, "reference").double()
    full.load_state_dict(windowed.state_dict())
    ids, _ = _batch(1)
    with torch.no_grad():
        a, b = windowed.logits(ids), full.logits(ids)
    assert torch.equal(a[:, :9], b[:, :9]) and _rel(a[:, 9:], b[:, 9:]) > 1e-3


@pytest.mark.parametrize("route", ["triton", "torch"])
@pytest.mark.parametrize("name", ["gqa", "mistral-window"])
def test_float32_flash_matches_transformers(name, route, monkeypatch):
    """Both CPU routes of the flash backend (the Triton kernels under the interpreter, the
    PyTorch path) in float32: the error against the float64 truth is float32 rounding, no more
    than transformers' own float32 run has (with a little room)."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(0)
    model = tiny_llama("flash", torch.float32, **CONFIGS[name])
    truth = _theirs(hf_twin(model, torch.float64), *_batch(2, seqlen=29))
    hf32 = _theirs(hf_twin(model, torch.float32), *_batch(2, seqlen=29))
    ours = _ours(model, *_batch(2, seqlen=29))
    for i, what in enumerate(("logits", "loss")):
        base = max(_rel(hf32[i], truth[i]), 1e-7)
        assert _rel(ours[i], truth[i]) < 4 * base + 1e-6, what
    assert ours[2].keys() == truth[2].keys()  # every gradient compared, none passed over
    for name_, g in ours[2].items():
        base = max(_rel(hf32[2][name_], truth[2][name_]), 1e-7)
        assert _rel(g, truth[2][name_]) < 4 * base + 1e-6, name_
