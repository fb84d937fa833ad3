"""flash_attn_with_kvcache against float64 attention on the concatenated sequence and against
flash_attn_func; both CPU routes (the split-KV kernel under the interpreter, the PyTorch path)."""

import math

import pytest
import torch

from flashtrain.attention import flash_attn_func, flash_attn_with_kvcache
from flashtrain.attention.reference import attention_reference
from flashtrain.kernels.flash_decode import MAX_SPLITS, choose_splits


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _reference(q, k_seq, v_seq, **kw):
    """float64 (out, lse) of one batch entry: q (1, Sq, Hq, D) against k_seq (1, L, Hkv, D)."""
    return attention_reference(q.double(), k_seq.double(), v_seq.double(), **kw)


def _rotate_reference(x, cos, sin, positions, interleaved):
    """Rotary by complex multiplication (independent of flashtrain.attention.rotary).
    x (S, H, D), positions (S,)."""
    rot = 2 * cos.shape[1]
    xr = x[..., :rot].double()
    if not interleaved:  # halves -> pairs, rotate, back
        half = rot // 2
        xr = torch.stack((xr[..., :half], xr[..., half:]), dim=-1).flatten(-2)
    z = torch.view_as_complex(xr.reshape(*xr.shape[:-1], -1, 2).contiguous())
    angle = torch.polar(torch.ones_like(cos.double()), torch.atan2(sin.double(), cos.double()))
    z = z * angle[positions][:, None, :]
    out = torch.view_as_real(z).flatten(-2)
    if not interleaved:
        out = torch.cat((out[..., 0::2], out[..., 1::2]), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rot:]), dim=-1)


def _tolerance(dtype):
    return 2e-5 if dtype == torch.float32 else 4e-3


CASES = [
    # batch, seqlen_q, heads_q, heads_kv, head_dim, cache_len, options
    (3, 1, 4, 2, 16, 37, dict(causal=True)),
    (2, 1, 3, 3, 24, 50, dict(causal=False, softcap=2.0)),
    (2, 3, 4, 1, 16, 29, dict(causal=True, window_size=(5, 0))),
    (2, 2, 2, 2, 32, 41, dict(causal=True, alibi=True)),
    (2, 5, 2, 1, 8, 33, dict(causal=False, window_size=(3, 2), softcap=1.5)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[:6]}-{sorted(c[6])}")
def test_matches_float64_per_batch_lengths(case, dtype):
    batch, sq, hq, hkv, d, cache_len, opts = case
    opts = dict(opts)
    torch.manual_seed(sum(case[:6]))
    q, kc, vc = _rand(batch, sq, hq, d, dtype=dtype), _rand(batch, cache_len, hkv, d, dtype=dtype), _rand(batch, cache_len, hkv, d, dtype=dtype)  # fmt: skip
    slopes = torch.rand(batch, hq) * 0.5 if opts.pop("alibi", False) else None
    lens = torch.randint(sq, cache_len + 1, (batch,), dtype=torch.int32)
    lens[0] = cache_len  # the full cache, an odd length
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, alibi_slopes=slopes, return_softmax_lse=True, **opts
    )
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (batch, hq, sq)
    for b in range(batch):
        length = int(lens[b])
        ref_out, ref_lse = _reference(
            q[b : b + 1], kc[b : b + 1, :length], vc[b : b + 1, :length],
            alibi_slopes=None if slopes is None else slopes[b : b + 1], **opts,
        )  # fmt: skip
        torch.testing.assert_close(out[b : b + 1].double(), ref_out, atol=_tolerance(dtype), rtol=0)
        torch.testing.assert_close(lse[b : b + 1].double(), ref_lse.double(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("interleaved", [True, False])
def test_append_with_rotary_in_place_equals_attention_on_the_concatenation(interleaved):
    """New k, v land rotated at cache_seqlens in the rows cache_batch_idx names; everything else
    in the cache is untouched; the output equals flash_attn_func on the whole sequence."""
    torch.manual_seed(3 + interleaved)
    batch, sq, hq, hkv, d, cache_rows, cache_len, rot_dim = 2, 3, 4, 2, 16, 3, 23, 12
    q = _rand(batch, sq, hq, d)
    k_new, v_new = _rand(batch, sq, hkv, d), _rand(batch, sq, hkv, d)
    kc, vc = _rand(cache_rows, cache_len, hkv, d), _rand(cache_rows, cache_len, hkv, d)
    kc0, vc0 = kc.clone(), vc.clone()
    lens = torch.tensor([4, 17], dtype=torch.int32)
    rows = torch.tensor([2, 0], dtype=torch.int32)
    angles = torch.rand(40, rot_dim // 2) * 2 * math.pi
    cos, sin = angles.cos(), angles.sin()
    out = flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
        cache_batch_idx=rows, causal=True, rotary_interleaved=interleaved,
    )  # fmt: skip
    untouched = torch.ones(cache_rows, cache_len, dtype=torch.bool)
    for b in range(batch):
        r, n = int(rows[b]), int(lens[b])
        pos = torch.arange(n, n + sq)
        k_rot = _rotate_reference(k_new[b], cos, sin, pos, interleaved)
        torch.testing.assert_close(kc[r, n : n + sq], k_rot, atol=1e-6, rtol=0)
        torch.testing.assert_close(vc[r, n : n + sq], v_new[b])
        untouched[r, n : n + sq] = False
        q_rot = _rotate_reference(q[b], cos, sin, pos, interleaved)[None]
        ref_out, _ = _reference(
            q_rot, kc[r : r + 1, : n + sq], vc[r : r + 1, : n + sq], causal=True
        )
        torch.testing.assert_close(out[b : b + 1].double(), ref_out, atol=2e-5, rtol=0)
        flash = flash_attn_func(
            q_rot, kc[r : r + 1, : n + sq], vc[r : r + 1, : n + sq], causal=True
        )
        torch.testing.assert_close(out[b : b + 1], flash, atol=2e-5, rtol=0)
    assert torch.equal(kc[untouched], kc0[untouched]) and torch.equal(vc[untouched], vc0[untouched])


def test_non_causal_rotary_puts_every_query_at_cache_seqlens():
    """flash-attn's rule: without causal or a window all query rows sit at cache_seqlens."""
    torch.manual_seed(5)
    q, k_new, v_new = _rand(1, 2, 2, 8), _rand(1, 2, 2, 8), _rand(1, 2, 2, 8)
    kc, vc = torch.zeros(1, 10, 2, 8), torch.zeros(1, 10, 2, 8)
    angles = torch.rand(10, 4)
    out = flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, rotary_cos=angles.cos(), rotary_sin=angles.sin(),
        cache_seqlens=3, rotary_interleaved=False,
    )  # fmt: skip
    q_rot = _rotate_reference(q[0], angles.cos(), angles.sin(), torch.tensor([3, 3]), False)[None]
    ref_out, _ = _reference(q_rot, kc[:, :5], vc[:, :5])
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=0)


def test_paged_cache_equals_the_contiguous_one():
    """Pages of 5 keys (not a tile multiple) shuffled in a pool: the same append and the same
    answer as a contiguous cache, each new key landing in its entry's page."""
    torch.manual_seed(9)
    batch, hq, hkv, d, page, pages_per_entry = 2, 4, 2, 16, 5, 5
    kc, vc = (
        _rand(batch, page * pages_per_entry, hkv, d),
        _rand(batch, page * pages_per_entry, hkv, d),
    )
    order = torch.randperm(batch * pages_per_entry)  # pool page order[i] holds logical page i
    table = torch.empty(batch, pages_per_entry, dtype=torch.int32)
    pool_k, pool_v = (
        torch.zeros(batch * pages_per_entry + 1, page, hkv, d),
        torch.zeros(batch * pages_per_entry + 1, page, hkv, d),
    )
    for b in range(batch):
        for p in range(pages_per_entry):
            slot = int(order[b * pages_per_entry + p])
            table[b, p] = slot
            pool_k[slot], pool_v[slot] = (
                kc[b, p * page : (p + 1) * page],
                vc[b, p * page : (p + 1) * page],
            )
    q, k_new, v_new = _rand(batch, 2, hq, d), _rand(batch, 2, hkv, d), _rand(batch, 2, hkv, d)
    lens = torch.tensor([9, 17], dtype=torch.int32)  # the new keys cross a page boundary (9, 10)
    opts = dict(cache_seqlens=lens, causal=True, return_softmax_lse=True)
    want = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, **opts)
    got = flash_attn_with_kvcache(q, pool_k, pool_v, k_new, v_new, block_table=table, **opts)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=0)
    for b in range(batch):
        for j in range(int(lens[b]) + 2):
            torch.testing.assert_close(pool_k[table[b, j // page], j % page], kc[b, j])


def test_leftpad_keys_are_never_attended():
    torch.manual_seed(6)
    q, kc, vc = _rand(2, 1, 2, 16), _rand(2, 20, 2, 16), _rand(2, 20, 2, 16)
    lens = torch.tensor([12, 20], dtype=torch.int32)
    pad = torch.tensor([5, 0], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pad, causal=True)
    for b in range(2):
        lo, hi = int(pad[b]), int(lens[b])
        ref_out, _ = _reference(
            q[b : b + 1], kc[b : b + 1, lo:hi], vc[b : b + 1, lo:hi], causal=True
        )
        torch.testing.assert_close(out[b : b + 1].double(), ref_out, atol=2e-5, rtol=0)


@pytest.mark.single_route
@pytest.mark.parametrize(
    "options",
    # alibi: ~8 s under the interpreter, under -m slow (the suite's 10 minutes); a causal ALiBi
    # decode against the reference stays in the normal suite (CASES above)
    [{}, pytest.param({"alibi": True}, marks=pytest.mark.slow), {"window_size": (37, 0)}],
    ids=["plain", "alibi", "window"],
)
def test_every_split_count_gives_the_same_answer(options):
    """The kernel (interpreter, 16-key tiles) over a 400-token cache (25 key tiles): 1, 2, 3, 5,
    24 and 25 splits, 64 (capped at one per key tile: 25) and the shape's choice give one answer,
    equal to float64 attention; the short entry leaves most splits empty, and the window leaves
    most of the long entry's splits outside it (lse -inf, weight 0 in the merge)."""
    from flashtrain.kernels.flash_decode import decode_config

    torch.manual_seed(7)
    cache_len, sq, hq, hkv, d = 400, 2, 4, 2, 16
    q, kc, vc = _rand(2, sq, hq, d), _rand(2, cache_len, hkv, d), _rand(2, cache_len, hkv, d)
    key_tiles = -(-cache_len // decode_config(d, q.dtype, q.device, sq * hq // hkv).block_n)
    assert key_tiles >= 20  # so that 24, 25 and 64 are 20+ real splits
    lens = torch.tensor([cache_len, 9], dtype=torch.int32)
    opts = dict(causal=True, window_size=options.get("window_size", (-1, -1)))
    if options.get("alibi"):
        opts["alibi_slopes"] = torch.rand(2, hq) * 0.5
    results = [
        flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, num_splits=n, return_softmax_lse=True, **opts
        )
        for n in (1, 2, 3, 5, 24, 25, 64, 0)
    ]
    for out, lse in results[1:]:
        torch.testing.assert_close(out, results[0][0], atol=1e-6, rtol=0)
        torch.testing.assert_close(lse, results[0][1], atol=1e-6, rtol=0)
    for b, length in enumerate(lens.tolist()):
        slopes = opts.get("alibi_slopes")
        ref_out, ref_lse = _reference(
            q[b : b + 1], kc[b : b + 1, :length], vc[b : b + 1, :length], causal=True,
            window_size=opts["window_size"],
            alibi_slopes=None if slopes is None else slopes[b : b + 1],
        )  # fmt: skip
        torch.testing.assert_close(results[-1][0][b : b + 1].double(), ref_out, atol=2e-5, rtol=0)
        torch.testing.assert_close(results[-1][1][b : b + 1].double(), ref_lse, atol=2e-5, rtol=0)


def test_chunked_prefill_then_decode_equals_one_causal_pass():
    """Prefill in two chunks (Sq > 1, causal bottom-right), then a token at a time: the outputs
    equal flash_attn_func over the whole sequence."""
    torch.manual_seed(8)
    total, hq, hkv, d = 11, 4, 2, 16
    q, k, v = _rand(1, total, hq, d), _rand(1, total, hkv, d), _rand(1, total, hkv, d)
    kc, vc = torch.zeros(1, 16, hkv, d), torch.zeros(1, 16, hkv, d)
    pieces, at = [], 0
    for step in (4, 3, 1, 1, 1, 1):
        s = slice(at, at + step)
        pieces.append(
            flash_attn_with_kvcache(
                q[:, s], kc, vc, k[:, s], v[:, s], cache_seqlens=at, causal=True
            )
        )
        at += step
    full = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=0)


def test_empty_cache_rows_give_zero_and_minus_inf():
    q, kc, vc = _rand(2, 1, 2, 8), _rand(2, 6, 2, 8), _rand(2, 6, 2, 8)
    lens = torch.tensor([0, 6], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_softmax_lse=True)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool(torch.isneginf(lse[0]).all())
    assert bool(torch.isfinite(lse[1]).all())


def test_choose_splits_fills_the_gpu_without_empty_splits():
    assert choose_splits(programs=264, key_tiles=1000, multiprocessors=132) == 1
    assert choose_splits(programs=8, key_tiles=1000, multiprocessors=132) == 33
    assert choose_splits(programs=1, key_tiles=5, multiprocessors=132) == 5
    assert choose_splits(programs=1, key_tiles=10**6, multiprocessors=132) == MAX_SPLITS


@pytest.mark.single_route
def test_op_registration():
    from flashtrain.attention.kvcache_op import kvcache_attention

    args = (_rand(1, 1, 2, 8), _rand(1, 5, 1, 8), _rand(1, 5, 1, 8),
            torch.tensor([4], dtype=torch.int32), None, None, None, None, 0.3, -1, 0, 0.0, 0)  # fmt: skip
    torch.library.opcheck(kvcache_attention, args)


def _bad_calls():
    k1 = _rand(2, 1, 2, 8)
    lens = torch.tensor([3, 4], dtype=torch.int32)
    pages = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    yield dict(block_table=pages.long()), "block_table must be an int32"
    yield dict(block_table=pages + 1), "block_table must index the cache's 2 pages"
    yield dict(block_table=pages, cache_batch_idx=pages[:, 0]), "drop cache_batch_idx"
    yield dict(k=k1), "k and v must be given together"
    yield dict(k=k1, v=k1), "needs cache_seqlens"
    yield dict(cache_seqlens=lens.long()), "cache_seqlens must be an int32 tensor"
    yield dict(cache_seqlens=torch.tensor([3, 9], dtype=torch.int32), k=k1, v=k1), "must lie in"
    yield dict(cache_seqlens=lens, rotary_cos=torch.ones(9, 2)), "pass k and v too"
    yield (
        dict(
            cache_seqlens=lens, k=k1, v=k1, rotary_cos=torch.ones(9, 6), rotary_sin=torch.ones(9, 6)
        ),
        "rotary_dim",
    )
    rope = dict(rotary_cos=torch.ones(4, 2), rotary_sin=torch.ones(4, 2))
    yield dict(cache_seqlens=lens, k=k1, v=k1, **rope), "rotary_cos has 4 positions"
    yield (
        dict(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)),
        "cache_batch_idx must index",
    )
    yield dict(num_splits=-1), "num_splits"
    yield dict(k=_rand(2, 1, 2, 4), v=_rand(2, 1, 2, 4), cache_seqlens=lens), "like the cache"
    yield dict(window_size=(-2, 0)), "window_size"
    yield (
        dict(cache_seqlens=lens, cache_leftpad=torch.tensor([4, 0], dtype=torch.int32)),
        "cache_leftpad",
    )
    yield dict(q=_rand(2, 1, 3, 8)), "multiple of heads_kv"
    yield dict(q=_rand(3, 1, 4, 8)), "pass cache_batch_idx"


@pytest.mark.single_route
@pytest.mark.parametrize("bad", list(_bad_calls()), ids=lambda b: b[1])
def test_bad_input_is_a_clear_value_error(bad):
    kwargs, message = bad
    q = kwargs.pop("q", _rand(2, 1, 4, 8))
    kc, vc = _rand(2, 9, 2, 8), _rand(2, 9, 2, 8)
    with pytest.raises(ValueError, match=message):
        flash_attn_with_kvcache(q, kc, vc, **kwargs)


@pytest.mark.single_route
def test_no_host_reads_on_the_kernel_route(monkeypatch):
    """What a GPU call does (index values unchecked): flashtrain code never reads a tensor's
    value into Python (.item(), .tolist(), bool/int/float/index of a tensor), so a decode step
    neither synchronises nor breaks a CUDA graph."""
    import os
    import sys
    from pathlib import Path

    import flashtrain
    from flashtrain.attention import validation

    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip("runs the kernels under the interpreter")
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "triton")
    monkeypatch.setattr(validation, "values_checked", lambda device: False)
    ours = (str(Path(flashtrain.__file__).resolve().parent),
            str(Path(flashtrain.__file__).resolve().parents[1] / "kernels"))  # fmt: skip
    reads = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def watched(tensor, *args, _original=original, _name=name, **kwargs):
            caller = str(Path(sys._getframe(1).f_code.co_filename).resolve())
            if caller.startswith(ours):
                reads.append(f"{_name} in {caller}:{sys._getframe(1).f_lineno}")
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, watched)
    q, kc, vc = _rand(2, 1, 4, 16), _rand(2, 40, 2, 16), _rand(2, 40, 2, 16)
    k_new, v_new = _rand(2, 1, 2, 16), _rand(2, 1, 2, 16)
    angles = torch.rand(48, 8)
    flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, rotary_cos=angles.cos(), rotary_sin=angles.sin(),
        cache_seqlens=torch.tensor([5, 30], dtype=torch.int32), causal=True,
        cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32), num_splits=0,
        alibi_slopes=torch.ones(4), return_softmax_lse=True,
    )  # fmt: skip
    assert reads == []


@pytest.mark.single_route
def test_a_decode_step_compiles_as_one_graph(monkeypatch):
    """torch.compile(fullgraph=True) captures the validation, the in-place append and the op
    (an opaque node) without a graph break; same output and the same cache as eager."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")

    def step(q, kc, vc, k, v, lens):
        return flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q, k, v = _rand(2, 1, 4, 16), _rand(2, 1, 2, 16), _rand(2, 1, 2, 16)
    kc, vc = torch.zeros(2, 20, 2, 16), torch.zeros(2, 20, 2, 16)
    kc2, vc2 = kc.clone(), vc.clone()
    lens = torch.tensor([3, 7], dtype=torch.int32)
    torch.testing.assert_close(compiled(q, kc, vc, k, v, lens), step(q, kc2, vc2, k, v, lens))
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2) and kc.abs().sum() > 0
