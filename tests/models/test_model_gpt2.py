"""GPT-2: logits against a from-scratch forward, causality, the chunked loss, positions, init."""

import math

import pytest
import torch
import torch.nn.functional as F
from model_testing import TINY_GPT2, PeakMemory

from flashtrain.checkpoint import initial_weights
from flashtrain.models import GPT2, build_model, linear_cross_entropy


@pytest.fixture
def torch_attention(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")


def reference_gpt2_logits(sd: dict, n_layer: int, n_head: int, ids: torch.Tensor) -> torch.Tensor:
    """GPT-2 by the paper, in float64, from the state dict alone."""
    sd = {k: v.double() for k, v in sd.items()}
    batch, seqlen = ids.shape
    c = sd["wte.weight"].shape[1]
    d = c // n_head

    def layer_norm(x, w, b):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    x = sd["wte.weight"][ids] + sd["wpe.weight"][:seqlen]
    future = torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1)
    for i in range(n_layer):
        p = f"blocks.{i}."
        h = layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        qkv = h @ sd[p + "attn.c_attn.weight"].T + sd[p + "attn.c_attn.bias"]
        q, k, v = (t.view(batch, seqlen, n_head, d).transpose(1, 2) for t in qkv.split(c, -1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = scores.masked_fill(future, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(batch, seqlen, c)
        x = x + y @ sd[p + "attn.c_proj.weight"].T + sd[p + "attn.c_proj.bias"]
        h = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        h = gelu(h @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"])
        x = x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]
    x = layer_norm(x, sd["ln_f.weight"], sd["ln_f.bias"])
    return x @ sd["wte.weight"].T  # (B, T, V)


def randomise(model, scale=0.5):
    """Weights larger than GPT-2's init, so attention is far from uniform and errors would show."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, scale / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.1)
            if p.dim() == 1 and p.shape[0] == model.config.d_model:
                p.add_(1.0)  # LayerNorm-like gains near 1
    return model


@pytest.mark.parametrize("impl", ["flash", "sdpa", "reference"])
def test_logits_match_from_scratch_forward(impl, torch_attention):
    torch.manual_seed(0)
    model = randomise(build_model(TINY_GPT2, {"impl": impl})).eval()
    ids = torch.randint(0, 97, (2, 50))
    want = reference_gpt2_logits(model.state_dict(), 2, 2, ids)
    got = model.logits(ids)
    assert got.shape == (2, 50, 97)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    labels = torch.randint(0, 97, (2, 50))
    labels[0, :7] = -100
    out = model(input_ids=ids, labels=labels)
    ref_loss = F.cross_entropy(want.reshape(-1, 97), labels.reshape(-1), ignore_index=-100)
    assert out.num_targets.item() == 100 - 7 and out.num_targets.dtype == torch.int64
    assert out.loss.dtype == torch.float32 and out.logits is None
    torch.testing.assert_close(out.loss.double(), ref_loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["flash", "sdpa", "reference"])
def test_future_tokens_never_change_earlier_logits(impl, monkeypatch):
    if impl == "flash":
        monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "triton")  # the real kernels (interpreter)
    torch.manual_seed(1)
    model = randomise(build_model(TINY_GPT2, {"impl": impl})).eval()
    ids = torch.randint(0, 97, (1, 40))
    changed = ids.clone()
    changed[0, 25:] = (changed[0, 25:] + 1 + torch.arange(15)) % 97
    with torch.no_grad():
        a, b = model.logits(ids), model.logits(changed)
    assert torch.equal(a[:, :25], b[:, :25])
    assert (a[:, 25:] - b[:, 25:]).abs().amax(-1).min() > 1e-3  # every later position changes


def test_rotary_positions(torch_attention):
    torch.manual_seed(2)
    learned = build_model(TINY_GPT2, {"impl": "sdpa"})
    model = randomise(build_model({**TINY_GPT2, "position": "rotary"}, {"impl": "sdpa"})).eval()
    assert model.wpe is None
    assert model.num_parameters() == learned.num_parameters() - 64 * 64
    ids = torch.randint(0, 97, (1, 32))
    shifted = torch.cat([torch.randint(0, 97, (1, 5)), ids], dim=1)  # same tokens, 5 later
    with torch.no_grad():
        a, b = model.logits(ids), model.logits(shifted)
        # rotary is relative: the first token's logit differs (it sees one token) ...
        assert (a[:, 1:] - b[:, 6:]).abs().max() > 1e-3
        changed = ids.clone()
        changed[0, 20:] = (changed[0, 20:] + 1) % 97
        c = model.logits(changed)
    assert torch.equal(a[:, :20], c[:, :20])  # ... and causal
    with torch.no_grad():  # rotary has no table, so it runs past max_seq_len
        assert model.logits(torch.zeros(1, 80, dtype=torch.long)).shape == (1, 80, 97)


def test_vocab_padding_does_not_change_the_model(torch_attention):
    torch.manual_seed(3)
    plain = randomise(build_model(TINY_GPT2, {"impl": "sdpa"}))
    padded = build_model({**TINY_GPT2, "pad_vocab_multiple": 64}, {"impl": "sdpa"})
    assert padded.wte.weight.shape[0] == 128
    sd = plain.state_dict()
    sd["wte.weight"] = torch.cat([sd["wte.weight"], torch.randn(31, 64) * 10])  # junk rows
    padded.load_state_dict(sd)
    ids = torch.randint(0, 97, (2, 30))
    a, b = plain(input_ids=ids, labels=ids), padded(input_ids=ids, labels=ids)
    torch.testing.assert_close(a.loss, b.loss)
    b.loss.backward()
    assert padded.wte.weight.grad[97:].abs().max() == 0  # padding rows are never used


def test_gpt2_initialisation():
    torch.manual_seed(4)
    cfg = {**TINY_GPT2, "n_layer": 8, "d_model": 256, "n_head": 4, "vocab_size": 1000}
    model = build_model(cfg, {"impl": "sdpa"})
    resid = torch.cat([b.attn.c_proj.weight.flatten() for b in model.blocks])
    resid = torch.cat([resid] + [b.mlp.c_proj.weight.flatten() for b in model.blocks])
    other = torch.cat(
        [model.wte.weight.flatten()] + [b.mlp.c_fc.weight.flatten() for b in model.blocks]
    )
    assert abs(resid.std().item() - 0.02 / math.sqrt(16)) < 2e-4
    assert abs(other.std().item() - 0.02) < 2e-4
    assert all(b.attn.c_attn.bias.abs().max() == 0 for b in model.blocks)
    assert all(torch.equal(b.ln_1.weight, torch.ones(256)) for b in model.blocks)


# ---- longer context from a shorter checkpoint --------------------------------------------------


def test_extending_positions_from_a_shorter_checkpoint(tmp_path):
    torch.manual_seed(5)
    short = build_model({**TINY_GPT2, "max_seq_len": 32}, {"impl": "sdpa"})
    old = short.wpe.weight.detach().clone()
    long = build_model(TINY_GPT2, {"impl": "sdpa"})  # 64 positions
    long.load_state_dict_extended(short.state_dict(), mode="copy")
    assert torch.equal(long.wpe.weight[:32], old) and torch.equal(long.wpe.weight[32:], old)
    assert torch.equal(long.blocks[1].mlp.c_fc.weight, short.blocks[1].mlp.c_fc.weight)
    long.load_state_dict_extended(short.state_dict(), mode="interpolate")
    new = long.wpe.weight.detach()
    assert new.shape == (64, 64)
    # linear interpolation by 2 (align_corners=False): new[2i+1] = 3/4 old[i] + 1/4 old[i+1]
    torch.testing.assert_close(new[1:-1:2], 0.75 * old[:-1] + 0.25 * old[1:])
    torch.testing.assert_close(new[0], old[0])
    # the same through the config: model.init_from, as the trainer builds it
    path = tmp_path / "short.pt"
    torch.save({"model": short.state_dict(), "step": 10}, path)
    cfg = {**TINY_GPT2, "init_from": str(path), "init_positions": "copy"}
    from_cfg = build_model(cfg, {"impl": "sdpa"})
    initial_weights(from_cfg, from_cfg.config.init_from)
    assert torch.equal(from_cfg.wpe.weight[32:], old)
    with torch.device("meta"):  # deferred init: the checkpoint loads once placed on a device
        deferred = build_model(cfg, {"impl": "sdpa"})
    initial_weights(deferred, deferred.config.init_from, device="cpu")
    assert torch.equal(deferred.wpe.weight[32:], old)
    with pytest.raises(ValueError, match="allowed: interpolate, copy"):
        long.load_state_dict_extended(short.state_dict(), mode="cubic")


# ---- the chunked loss ----------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_cross_entropy_equals_full(chunk_size, with_bias):
    torch.manual_seed(6)
    h = torch.randn(53, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(40, dtype=torch.float64, requires_grad=True) if with_bias else None
    y = torch.randint(0, 40, (53,))
    loss, hits = linear_cross_entropy(h, w, y, b, chunk_size=chunk_size)
    (loss * 0.37).backward()
    got = [h.grad, w.grad] + ([b.grad] if with_bias else [])
    h2, w2 = h.detach().requires_grad_(), w.detach().requires_grad_()
    b2 = b.detach().requires_grad_() if with_bias else None
    logits = h2 @ w2.T + (b2 if with_bias else 0)
    ref = F.cross_entropy(logits, y, reduction="sum")
    (ref * 0.37).backward()
    want = [h2.grad, w2.grad] + ([b2.grad] if with_bias else [])
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    assert hits.item() == (logits.argmax(-1) == y).sum().item()
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-8)
    with torch.no_grad():  # the no-grad path gives the same numbers
        nl, nh = linear_cross_entropy(h, w, y, b, chunk_size=chunk_size)
    torch.testing.assert_close(nl, loss.detach())
    assert nh == hits


def test_chunked_cross_entropy_under_bf16_autocast():
    torch.manual_seed(7)
    h = torch.randn(300, 32, requires_grad=True)
    w = torch.randn(500, 32, requires_grad=True)
    y = torch.randint(0, 500, (300,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(h, w, y, chunk_size=64)
    loss.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == w.grad.dtype == torch.float32
    ref = F.cross_entropy(h.detach() @ w.detach().T, y, reduction="sum")
    assert abs(loss.item() - ref.item()) / ref.item() < 2e-2


def test_lm_loss_never_holds_full_vocab_logits(torch_attention):
    """The head + loss of 2048 tokens over a 4096 vocab in chunks of 128: peak memory stays far
    below the 32 MiB of (tokens, vocab) float32 logits, and no saved tensor is that big."""
    torch.manual_seed(8)
    n, v, c = 2048, 4096, 64
    h = torch.randn(n, c, requires_grad=True)
    w = torch.randn(v, c, requires_grad=True)
    y = torch.randint(0, v, (n,))
    full_logits_bytes = n * v * 4
    saved = []
    with (
        PeakMemory() as meter,
        torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel()) or t, lambda t: t
        ),
    ):
        loss, _ = linear_cross_entropy(h, w, y, chunk_size=128)
        loss.backward()
    assert max(saved) < n * v / 4
    assert meter.peak < full_logits_bytes / 4, meter.peak
    # the meter does see a full-logits loss
    with PeakMemory() as meter_full:
        F.cross_entropy(h @ w.T, y).backward()
    assert meter_full.peak >= full_logits_bytes


def test_long_sequence_runs_with_linear_attention_memory(torch_attention):
    """seq 512 through flash (torch path): nothing (T, T)-shaped is saved for the backward pass;
    the reference implementation, which does store the scores, is caught by the same check."""

    def saved_square(impl):
        torch.manual_seed(9)
        model = build_model({**TINY_GPT2, "max_seq_len": 512, "d_model": 32}, {"impl": impl})
        ids = torch.randint(0, 97, (1, 512))
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t
        ):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return [s for s in shapes if list(s).count(512) >= 2]

    assert saved_square("flash") == []
    assert saved_square("reference") != []


def test_forward_needs_labels_of_the_same_shape():
    model = build_model(TINY_GPT2, {"impl": "sdpa"})
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="labels"):
        model(input_ids=ids, labels=ids[:, :4])
    with pytest.raises(ValueError, match=r"labels must be in \[0, 97\)"):
        model(input_ids=ids, labels=ids + 97)
    assert isinstance(model, GPT2)
