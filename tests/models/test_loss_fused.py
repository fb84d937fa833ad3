"""The fused LM-head cross-entropy kernels (under TRITON_INTERPRET=1 on CPU) against a float64
reference: loss, grad_hidden, grad_weight, grad_bias and hits, at sizes that are not multiples of
the tiles, with every option; and the chunked path's new options against the same reference.

Interpreter tiles are 16 tokens x 32 vocabulary rows x 16 hidden columns, aiming at 6 programs:
  (37, 24, 150): 3 token tiles, 5 vocabulary tiles in 2 splits (forward, grad_hidden) and
                 2 token splits (grad_weight); C = 24 leaves a masked hidden chunk
  (100, 32, 75): 7 token tiles, one forward split; grad_weight in 2 token splits; C even
  (5, 16, 33):   one token tile shorter than a tile, 2 vocabulary splits of one tile each
"""

import pytest
import torch
from loss_testing import (
    IGNORE,
    assert_close_to_reference,
    compiled_fused_loss,
    head_inputs,
    reference,
    run_loss,
)

from flashtrain.models.fused_cross_entropy import linear_xent_forward
from flashtrain.models.loss import linear_cross_entropy, resolve_loss_impl, token_loss

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="interpreter tests; tests/models/test_loss_fused_gpu.py on GPUs",
)

OPTIONS = {
    "plain": {},
    "ignore+bias": {"ignored": 9, "bias": True},
    "smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-2},
    "all": {"ignored": 9, "label_smoothing": 0.2, "z_loss": 1e-3, "bias": True},
}
CASES = [((37, 24, 150), name) for name in OPTIONS] + [
    ((100, 32, 75), "plain"),
    ((100, 32, 75), "all"),
    ((5, 16, 33), "all"),
]


def _check(shape, opts, dtype, impl, autocast_dtype=None):
    loss_kwargs = {k: v for k, v in opts.items() if k in ("label_smoothing", "z_loss")}
    h, w, b, y = head_inputs(
        *shape,
        dtype=dtype,
        ignored=min(opts.get("ignored", 0), shape[0] // 3),
        bias=opts.get("bias", False),
    )
    truth = reference(h, w, y, b, **loss_kwargs)
    low = run_loss(
        h, w, y, b, impl="chunked", chunk_size=16, autocast_dtype=autocast_dtype, **loss_kwargs
    )
    got = run_loss(h, w, y, b, impl=impl, autocast_dtype=autocast_dtype, **loss_kwargs)
    assert_close_to_reference(got, truth, low, autocast_dtype or dtype)
    return got, truth


@pytest.mark.parametrize("shape,option", CASES, ids=[f"{s[0]}x{s[1]}x{s[2]}-{o}" for s, o in CASES])
def test_fused_matches_float64_reference(shape, option):
    got, truth = _check(shape, OPTIONS[option], torch.float32, "fused")
    assert got["loss"].dtype == torch.float32
    assert got["hits"].item() == truth["hits"].item()


@pytest.mark.parametrize("option", ["plain", "all"])
def test_chunked_matches_float64_reference(option):
    got, truth = _check((37, 24, 150), OPTIONS[option], torch.float32, "chunked")
    assert got["hits"].item() == truth["hits"].item()


def test_fused_float16_inputs_within_twice_pytorch_error():
    got, _ = _check((37, 24, 150), OPTIONS["all"], torch.float16, "fused")
    assert got["dh"].dtype == got["dw"].dtype == got["db"].dtype == torch.float16


def test_fused_under_float16_autocast_keeps_float32_gradients():
    """fp32 leaves, fp16 products: the grads come back in float32, accumulated in float32."""
    got, _ = _check((37, 24, 150), OPTIONS["all"], torch.float32, "fused", torch.float16)
    assert got["dh"].dtype == got["dw"].dtype == got["db"].dtype == torch.float32


def _tied_model_grads(impl, dtype, head_only=False, vocab=70, pad=6, width=24, tokens=29):
    """GPT-2's layout: the head is the first `vocab` rows of a padded token embedding, which
    also embeds the inputs; both uses accumulate into the one parameter (head_only: the input
    path detached, so only the head's gradient arrives)."""
    torch.manual_seed(3)
    emb = torch.nn.Embedding(vocab + pad, width).to(dtype)
    proj = torch.nn.Linear(width, width).to(dtype)
    ids = torch.randint(0, vocab // 2, (tokens,))  # the inputs use only the first half of the rows
    y = torch.randint(0, vocab, (tokens,))
    x = emb(ids)  # (N, C)
    h = torch.tanh(proj(x.detach() if head_only else x))  # (N, C)
    if impl == "reference":
        loss = torch.nn.functional.cross_entropy(h @ emb.weight[:vocab].t(), y, reduction="sum")
    else:
        loss, _ = linear_cross_entropy(h, emb.weight[:vocab], y, impl=impl)
    loss.backward()
    return loss.detach(), emb.weight.grad


def test_tied_embedding_gradients_accumulate():
    loss, emb_grad = _tied_model_grads("fused", torch.float32)
    ref_loss, ref_grad = _tied_model_grads("reference", torch.float64)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(emb_grad.double(), ref_grad, rtol=1e-4, atol=1e-5)
    # The input path's share: the rows the inputs used, and only those.
    _, head_grad = _tied_model_grads("fused", torch.float32, head_only=True)
    input_share = (emb_grad - head_grad).abs().sum(dim=1)  # (V + pad,)
    assert (input_share[:35] > 0).any() and not input_share[35:].any()
    assert not head_grad[70:].any()  # padding rows get nothing from the head


@pytest.mark.parametrize("tokens", [5, 37], ids=["split-per-tile", "tiles-per-split"])
def test_argmax_ties_pick_the_first_column_as_torch_does(tokens):
    """Rows 5 and 69 of the weight are equal and dominate every token's logits: the argmax is
    column 5 (torch picks the first maximum), whether the two columns fall in different vocab
    splits (5 tokens: one tile per split) or in different tiles of one split (37 tokens)."""
    c, v = 16, 130
    g = torch.Generator().manual_seed(4)
    u = torch.randn(c, generator=g)
    w = 0.1 * torch.randn(v, c, generator=g)
    w[5] = w[69] = 3.0 * u
    h = 2.0 * u + 0.05 * torch.randn(tokens, c, generator=g)
    y = torch.where(torch.arange(tokens) % 2 == 0, 5, 69)
    z = h.double() @ w.double().t()
    assert torch.equal(z[:, 5], z[:, 69]) and (z.argmax(-1) == 5).all()
    with torch.no_grad():
        _, hits = linear_cross_entropy(h, w, y, impl="fused")
    assert hits.item() == (y == 5).sum().item()


def test_no_grad_path_and_hits_on_request():
    h, w, b, y = head_inputs(5, 16, 33, bias=True, ignored=1)
    with_grad = run_loss(h, w, y, b, impl="fused")
    with torch.no_grad():
        loss, hits = linear_cross_entropy(h, w, y, b, impl="fused")
        _, no_hits = linear_cross_entropy(h, w, y, b, impl="fused", compute_hits=False)
    assert torch.equal(loss, with_grad["loss"]) and hits.item() == with_grad["hits"].item()
    assert no_hits is None


def test_all_ignored_and_empty_inputs_give_zero_loss_and_gradients():
    h, w, _, y = head_inputs(20, 16, 40)
    y[:] = IGNORE
    out = run_loss(h, w, y, impl="fused")
    assert out["loss"].item() == 0.0 and out["hits"].item() == 0
    assert not out["dh"].any() and not out["dw"].any()
    empty = run_loss(h[:0], w, y[:0], impl="fused")
    assert empty["loss"].item() == 0.0 and empty["dh"].shape == (0, 16) and not empty["dw"].any()


def test_token_loss_mean_over_counted_tokens():
    """token_loss: (B, T, C) hidden, (B, T) labels; the mean over labelled tokens, both impls."""
    h, w, _, y = head_inputs(2 * 19, 24, 150, ignored=5)
    results = {}
    for impl in ("chunked", "fused"):
        loss, num, hits = token_loss(h.view(2, 19, 24), y.view(2, 19), w, impl=impl)
        results[impl] = loss
        assert num.item() == 33 and hits is not None
    truth = reference(h, w, y)["loss"] / 33
    for impl, loss in results.items():
        torch.testing.assert_close(loss.double(), truth, rtol=1e-6, atol=1e-6, msg=impl)


def test_kernel_turns_out_of_range_labels_into_nan_without_a_sync():
    """The op itself never reads out of bounds for a bad label: that row's loss is NaN."""
    h, w, _, y = head_inputs(20, 16, 40)
    y[3], y[7] = 40, IGNORE
    loss, lse, _ = linear_xent_forward(h, w, None, y, IGNORE, 0.0, 0.0, torch.float32, False)
    assert torch.isnan(loss[3]) and loss[7] == 0.0
    assert (
        torch.isfinite(loss[[i for i in range(20) if i != 3]]).all() and torch.isfinite(lse).all()
    )


def test_ops_pass_opcheck():
    h, w, b, y = head_inputs(5, 16, 33, bias=True, ignored=1)
    h, w, b = (t.requires_grad_() for t in (h, w, b))
    fwd_args = (h, w, b, y, IGNORE, 0.1, 1e-3, torch.float32, True)
    torch.library.opcheck(torch.ops.flashtrain.linear_xent_forward.default, fwd_args)
    _, lse, _ = linear_xent_forward(*fwd_args)
    bwd_args = (torch.rand(5), h.detach(), w.detach(), b.detach(), y, lse.detach(), IGNORE, 0.1,
                1e-3, torch.float32, True, True)  # fmt: skip
    torch.library.opcheck(torch.ops.flashtrain.linear_xent_backward.default, bwd_args)


def test_fused_op_compiles_without_graph_break():
    h, w, _, y = head_inputs(37, 24, 150, ignored=3)
    eager = run_loss(h, w, y, impl="fused")
    fn = compiled_fused_loss(y, torch.float32, backend="aot_eager")
    hc, wc = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(hc, wc)
    (loss * 0.37).backward()
    torch.testing.assert_close(loss, eager["loss"])
    torch.testing.assert_close(hc.grad, eager["dh"])
    torch.testing.assert_close(wc.grad, eager["dw"])


# ---- the choice and the errors ----------------------------------------------------------------


def test_auto_is_fused_on_cuda_and_chunked_on_cpu():
    assert resolve_loss_impl("auto", torch.device("cuda")) == "fused"
    assert resolve_loss_impl("auto", torch.device("cpu")) == "chunked"
    assert resolve_loss_impl("fused", torch.device("cpu")) == "fused"
    with pytest.raises(ValueError, match="allowed: auto, fused, chunked"):
        resolve_loss_impl("fast", torch.device("cpu"))


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(y=torch.tensor([0, 1, 40, 2])), r"labels must be in \[0, 40\) or -100"),
        (dict(y=torch.tensor([0, 1, -3, 2])), r"got values in \[-3, 2\]"),
        (dict(y=torch.tensor([0, 1, 2])), r"targets must be integer \(4,\)"),
        (dict(y=torch.zeros(4)), "targets must be integer"),
        (dict(b=torch.zeros(39)), r"bias must be \(V,\) = \(40,\)"),
        (dict(w=torch.zeros(40, 8)), r"hidden \(N, C\) and weight \(V, C\)"),
        (dict(label_smoothing=1.5), r"label_smoothing must be in \[0, 1\]"),
        (dict(z_loss=-1e-4), "z_loss must be a finite coefficient >= 0"),
        (dict(chunk_size=0), "chunk_size must be >= 1"),
        (
            dict(impl="fused", h=torch.zeros(4, 16, dtype=torch.float64)),
            "float16, bfloat16 or float32",
        ),
    ],
)
def test_bad_input_raises_value_error(change, message):
    args = dict(h=torch.zeros(4, 16), w=torch.zeros(40, 16), y=torch.tensor([0, 1, 2, 3]), b=None)
    args.update(change)
    h, w, y, b = (args.pop(k) for k in ("h", "w", "y", "b"))
    if h.dtype == torch.float64:
        w = w.double()
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(h, w, y, b, **args)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_model_loss_impl_fused_equals_chunked(arch, monkeypatch):
    """model.loss_impl reaches the loss: a tiny GPT-2 / BERT-MLM gives the same loss and gradients
    through the fused kernels (counted: they do run) as through the chunked path."""
    import flashtrain.models.loss as loss_module
    from flashtrain.models import build_model

    fused_calls = []
    real_fused = loss_module.fused_linear_cross_entropy

    def counted_fused(*args, **kwargs):
        fused_calls.append(1)
        return real_fused(*args, **kwargs)

    monkeypatch.setattr(loss_module, "fused_linear_cross_entropy", counted_fused)

    cfg = {"arch": arch, "n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 61}
    cfg |= {"max_seq_len": 16, "dropout": 0.0, "attn_dropout": 0.0} if arch == "bert" else {}
    ids = torch.randint(0, 61, (2, 11))
    labels = torch.randint(0, 61, (2, 11))
    labels[0, ::3] = IGNORE
    results = []
    for impl in ("chunked", "fused"):
        torch.manual_seed(0)
        model = build_model({**cfg, "loss_impl": impl}, "reference")
        loss = model(ids, labels).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert len(fused_calls) == 1  # the chunked model never called it, the fused one once
    (loss_c, grads_c), (loss_f, grads_f) = results
    torch.testing.assert_close(loss_f, loss_c, rtol=1e-5, atol=1e-6)
    for g_f, g_c in zip(grads_f, grads_c, strict=True):
        torch.testing.assert_close(g_f, g_c, rtol=1e-4, atol=1e-6)


def test_model_loss_impl_is_checked():
    from flashtrain.models import build_model

    with pytest.raises(ValueError, match="model.loss_impl"):
        build_model(
            {"arch": "gpt2", "n_layer": 1, "n_head": 2, "d_model": 32, "loss_impl": "x"}, "sdpa"
        )
