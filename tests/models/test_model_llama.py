"""Llama beyond what transformers' LlamaForCausalLM covers: score and logit softcaps against a
from-scratch float64 forward, document masking with positions restarting per document,
causality on the kernels, counts, a shorter-context checkpoint at a longer context, refusals."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from llama_testing import TINY_LLAMA, tiny_llama

from flashtrain.checkpoint import initial_weights
from flashtrain.data.lm_batches import lm_batch
from flashtrain.models import build_model
from flashtrain.typed_config import ConfigError


def reference_llama_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The Llama forward by its definition, float64, from the state dict and config alone."""
    cfg = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    batch, seqlen = ids.shape
    h, hk, d = cfg.n_head, cfg.n_kv_head, cfg.head_dim

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    # the angles in float32, as every Llama implementation computes them (transformers too)
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2).float() / d)
    ang = (torch.arange(seqlen).float()[:, None] * inv).double()  # (T, D/2)

    def rope(t):  # (B, heads, T, D)
        t1, t2 = t[..., : d // 2], t[..., d // 2 :]
        cos, sin = ang.float().cos().double(), ang.float().sin().double()
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), -1)

    i = torch.arange(seqlen)
    allowed = i[None, :] <= i[:, None]
    if cfg.sliding_window:
        allowed &= i[None, :] > i[:, None] - cfg.sliding_window
    x = sd["embed_tokens.weight"][ids]
    for layer in range(cfg.n_layer):
        p = f"blocks.{layer}."
        a = rms(x, sd[p + "input_layernorm.weight"])
        q = (a @ sd[p + "self_attn.q_proj.weight"].T).view(batch, seqlen, h, d).transpose(1, 2)
        k = (a @ sd[p + "self_attn.k_proj.weight"].T).view(batch, seqlen, hk, d).transpose(1, 2)
        v = (a @ sd[p + "self_attn.v_proj.weight"].T).view(batch, seqlen, hk, d).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(d)
        if cfg.attn_logit_softcap:
            s = cfg.attn_logit_softcap * torch.tanh(s / cfg.attn_logit_softcap)
        y = (s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(1, 2)
        x = x + y.reshape(batch, seqlen, -1) @ sd[p + "self_attn.o_proj.weight"].T
        m = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = F.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
        x = x + g @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["norm.weight"])
    head = sd["embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]
    z = x @ head[: cfg.vocab_size].T
    if cfg.final_logit_softcap:
        z = cfg.final_logit_softcap * torch.tanh(z / cfg.final_logit_softcap)
    return z


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attn_logit_softcap=0.8),
        dict(final_logit_softcap=1.5, tie_embeddings=True),
        dict(attn_logit_softcap=0.8, final_logit_softcap=1.5, sliding_window=7),
    ],
)
def test_softcaps_match_the_definition(overrides):
    torch.manual_seed(0)
    model = tiny_llama("reference", **overrides)
    ids = torch.randint(0, 97, (2, 23))
    labels = torch.randint(0, 97, (2, 23))
    want = reference_llama_logits(model, ids)
    with torch.no_grad():
        got = model.logits(ids)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    plain = tiny_llama("reference", tie_embeddings=model.config.tie_embeddings)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():  # the caps are felt at these weights
        assert (plain.logits(ids) - got).abs().max() > 1e-3
    # loss and its gradients: our loss (chunked, with the cap inside) vs autograd of the definition
    out = model(ids, labels)
    out.loss.backward()
    ref_model = tiny_llama("reference", **overrides)
    ref_model.load_state_dict(model.state_dict())
    ref = F.cross_entropy(
        reference_llama_logits_autograd(ref_model, ids).reshape(-1, 97), labels.reshape(-1)
    )
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=0)
    for (name, p), (_, r) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-10, atol=1e-13, msg=name)


def reference_llama_logits_autograd(model, ids):
    """reference_llama_logits through the model's own parameters (differentiable)."""
    state = dict(model.named_parameters())
    model_sd = model.state_dict
    model.state_dict = lambda: state  # the reference reads tensors that require grad
    try:
        return reference_llama_logits(model, ids)
    finally:
        model.state_dict = model_sd


@pytest.mark.parametrize("route", ["triton", "torch"])
def test_document_masking_equals_each_document_alone(route, monkeypatch):
    """Packed documents (cu_seqlens, positions restarting after EOS) through the varlen kernel,
    with GQA and a sliding window: the loss of running each document alone."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(0)
    model = tiny_llama("flash", torch.float32, sliding_window=6).eval()
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(1, 97, (2, 24), generator=g)
    tokens[0, [5, 15]] = 0
    tokens[1, [9]] = 0
    batch = lm_batch(tokens.numpy(), eos_id=0)
    cu = batch["cu_seqlens"]
    with torch.no_grad():
        packed = model(**batch)
        flat_ids, flat_labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
        total, count = 0.0, 0
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
            alone = model(flat_ids[None, start:end], flat_labels[None, start:end])
            total += float(alone.loss) * int(alone.num_targets)
            count += int(alone.num_targets)
        whole = model(batch["input_ids"], batch["labels"])
    assert int(packed.num_targets) == count
    assert abs(float(packed.loss) - total / count) < 1e-5
    assert abs(float(whole.loss) - float(packed.loss)) > 1e-4


@pytest.mark.parametrize("scaling", ["none", "linear", "dynamic"])
def test_rope_length_comes_from_the_host(scaling, monkeypatch):
    """Only dynamic RoPE needs the sequence's length, and a packed batch gives it on the host:
    max_seqlen, its longest document (positions restart per document, so it is the largest
    position + 1); the position tensor is never read (on a GPU a read waits for the device)."""
    params = {"none": {}, "linear": dict(factor=2.0)}.get(
        scaling, dict(factor=2.0, original_max_seq_len=4)
    )
    model = tiny_llama("flash", torch.float32, rope_scaling=dict(type=scaling, **params))
    tokens = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(5))
    tokens[0, [5, 15]] = 0
    tokens[1, [9]] = 0
    batch = lm_batch(tokens.numpy(), eos_id=0)
    longest = int(batch["position_ids"].max()) + 1
    assert batch["max_seqlen"] == longest == 13  # row 1: tokens 10..22
    lengths = []
    tables = model.rotary_tables
    monkeypatch.setattr(
        model, "rotary_tables", lambda pos, n=None: lengths.append(n) or tables(pos, n)
    )
    reads = []  # tensor values read into Python by the model's own code
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def watched(t, *a, _original=original, _name=name, **k):
            caller = sys._getframe(1).f_code.co_filename
            if caller.endswith(("llama.py", "rotary.py", "positions.py")):
                reads.append(f"{caller}: {_name}")
            return _original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, watched)
    with torch.no_grad():
        model.hidden_states(
            batch["input_ids"], batch["cu_seqlens"], batch["max_seqlen"], batch["position_ids"]
        )
    monkeypatch.undo()
    assert lengths == [longest if scaling == "dynamic" else None]
    assert not reads, reads


@pytest.mark.parametrize("route", ["triton", "torch"])
def test_future_tokens_never_change_earlier_logits(route, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(1)
    model = tiny_llama("flash", torch.float32).eval()
    ids = torch.randint(0, 97, (1, 40))
    changed = ids.clone()
    changed[0, 25:] = (changed[0, 25:] + 1 + torch.arange(15)) % 97
    with torch.no_grad():
        a, b = model.logits(ids), model.logits(changed)
    assert torch.equal(a[:, :25], b[:, :25])
    assert (a[:, 25:] - b[:, 25:]).abs().amax(-1).min() > 1e-3


def test_recomputation_gives_the_same_gradients():
    torch.manual_seed(2)
    model = tiny_llama("reference")
    again = tiny_llama("reference", recompute="all")
    again.load_state_dict(model.state_dict())
    ids = torch.randint(0, 97, (2, 19))
    for m in (model, again):
        m(ids, ids).loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-13, atol=1e-15, msg=n)


# ---- counts ------------------------------------------------------------------------------------


def _published(**overrides):
    with torch.device("meta"):
        return build_model({"arch": "llama", "vocab_size": 128256, **overrides}, "flash")


def test_llama3_8b_and_1b_parameter_counts():
    assert _published().num_parameters() == 8_030_261_248  # Meta's Llama-3-8B
    one_b = dict(n_layer=16, n_head=32, n_kv_head=8, d_model=2048, d_ff=8192, tie_embeddings=True)
    assert _published(**one_b).num_parameters() == 1_235_814_400  # Llama-3.2-1B


def test_flops_count_gqa_swiglu_and_the_window():
    model = _published()
    cfg = model.config
    c, kv, f, n = cfg.d_model, cfg.kv_dim, cfg.d_ff, cfg.n_layer
    matmul = (
        n * (2 * c * c + 2 * c * kv + 3 * c * f) + c * cfg.vocab_size
    )  # the head, not the table
    assert model.num_parameters(non_embedding=True) == matmul + (2 * n + 1) * c  # + RMSNorm gains
    t = 8192
    assert model.estimate_flops_per_token(t) == 6 * (matmul + (2 * n + 1) * c) + 14 * n * c * t / 2
    windowed = _published(sliding_window=4096)  # a query sees min(i + 1, 4096) keys: 3072 a query
    assert windowed.estimate_flops_per_token(t) == model.estimate_flops_per_token(2 * 3072)
    assert _published(sliding_window=t).estimate_flops_per_token(
        t
    ) == model.estimate_flops_per_token(t)


# ---- longer context from a shorter checkpoint --------------------------------------------------


def test_init_from_a_shorter_context_with_rope_scaling(tmp_path):
    torch.manual_seed(3)
    short = build_model({**TINY_LLAMA, "max_seq_len": 16}, "sdpa")
    path = tmp_path / "short.pt"
    torch.save({"model": short.state_dict()}, path)
    scaling = dict(type="linear", factor=4.0)
    long = build_model(
        {**TINY_LLAMA, "max_seq_len": 64, "init_from": str(path), "rope_scaling": scaling}, "sdpa"
    )
    initial_weights(long, long.config.init_from)
    for name, value in short.state_dict().items():
        assert torch.equal(long.state_dict()[name], value), name
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():  # position interpolation: position 4p at the long model is p
        a = short.hidden_states(ids, position_ids=torch.arange(16)[None] * 1)
        b = long.hidden_states(ids, position_ids=torch.arange(16)[None] * 4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(n_kv_head=3),
            r"n_kv_head=3 does not divide model.n_head=4.*allowed n_kv_head: \[1, 2, 4\]",
        ),
        (
            dict(d_model=36, n_head=4, n_kv_head=4),
            "head_dim = d_model / n_head must be even, got 9",
        ),
        (
            dict(layer_norm_eps=1e-6),
            "layer_norm_eps does not apply to arch=llama; set model.rms_norm_eps",
        ),
        (dict(activation="gelu"), "activation does not apply to arch=llama"),
        (dict(sliding_window=0), "sliding_window must be >= 1"),
        (dict(attn_logit_softcap=-1.0), "attn_logit_softcap must be > 0 or null"),
        (
            dict(final_logit_softcap=30.0, loss_impl="fused"),
            "fused loss kernel has no logit softcap",
        ),
    ],
)
def test_bad_config_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_model({**TINY_LLAMA, **overrides}, "sdpa")


@pytest.mark.parametrize(
    "impl, overrides, message",
    [
        ("blocksparse", dict(sliding_window=8), "attention=blocksparse has no sliding window"),
        ("sdpa", dict(attn_logit_softcap=30.0), "attention=sdpa has no score softcap"),
    ],
)
def test_backends_refuse_what_they_cannot_do(impl, overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model({**TINY_LLAMA, **overrides}, impl)
