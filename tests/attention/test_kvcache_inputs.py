"""flash_attn_with_kvcache on unusual inputs (issue 25), both CPU routes:

- strided integer tables (cache_seqlens, cache_batch_idx, cache_leftpad, block_table) give the
  contiguous answer; the kernel launcher refuses them (25.2);
- masked cache entries never contribute: a NaN/inf in an unused slot past cache_seqlens, in the
  left padding, outside the window, past a row's causal diagonal or in an unused page slot leaves
  the output as if it were finite; one a row sees makes that row non-finite (25.10);
- offsets past 2^31 (head-major caches, long query chunks, outputs) are int64, and the limit
  left in int32 (keys per cache entry) is refused by name (25.10);
- a cache row named by two entries of cache_batch_idx is refused while k, v are appended (two
  entries' keys in one slot), and read by both without them (56.6).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtrain.attention import flash_attn_with_kvcache
from flashtrain.attention.reference import attention_reference
from flashtrain.attention.validation import MAX_SEQLEN

SCRIPT = Path(__file__).with_name("huge_strides_decode.py")
REPO = SCRIPT.parents[2]


def _strided(values, junk):
    """A stride-2 int32 view of `values` (1-D, or 2-D strided along its last dim) whose skipped
    entries hold `junk`: in range, so a kernel reading them gives a wrong answer, not a crash."""
    table = torch.tensor(values, dtype=torch.int32)
    spread = torch.full((*table.shape[:-1], 2 * table.shape[-1]), junk, dtype=torch.int32)
    spread[..., ::2] = table
    view = spread[..., ::2]
    assert view.stride(-1) == 2 and torch.equal(view, table)
    return view


def _caches(rows, length, heads, dim, seed):
    torch.manual_seed(seed)
    return torch.randn(rows, length, heads, dim), torch.randn(rows, length, heads, dim)


@pytest.mark.parametrize("append", [True, False], ids=["append", "attend"])
def test_strided_seqlens_batch_idx_and_leftpad_equal_contiguous(route, append):
    """Attend (after appending 2 keys, or not): strided tables give exactly the contiguous
    tables' output, lse and cache."""
    kc, vc = _caches(3, 24, 2, 16, seed=1)
    q, k, v = torch.randn(2, 2, 4, 16), torch.randn(2, 2, 2, 16), torch.randn(2, 2, 2, 16)
    k, v = (k, v) if append else (None, None)
    tables = dict(
        cache_seqlens=_strided([5, 17], junk=20),
        cache_batch_idx=_strided([2, 0], junk=1),
        cache_leftpad=_strided([3, 0], junk=1),
    )
    results = []
    for as_given in (tables, {name: t.contiguous() for name, t in tables.items()}):
        kc2, vc2 = kc.clone(), vc.clone()
        out, lse = flash_attn_with_kvcache(
            q, kc2, vc2, k, v, causal=True, return_softmax_lse=True, **as_given
        )
        results.append((out, lse, kc2, vc2))
    for name, a, b in zip(("out", "lse", "k_cache", "v_cache"), *results):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name} differs")


def test_strided_block_table_and_seqlens_equal_contiguous(route):
    """A paged cache whose table is a strided view: the same answer as its contiguous copy."""
    pool_k, pool_v = _caches(7, 5, 2, 16, seed=2)  # 7 pages of 5 keys
    q = torch.randn(2, 1, 2, 16)
    table = _strided([[4, 1, 6], [0, 5, 2]], junk=3)
    lens = _strided([13, 9], junk=15)
    opts = dict(causal=True, return_softmax_lse=True)
    got = flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=lens, block_table=table, **opts)
    want = flash_attn_with_kvcache(
        q, pool_k, pool_v, cache_seqlens=lens.contiguous(), block_table=table.contiguous(), **opts
    )
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.single_route
def test_decode_launcher_refuses_strided_tables():
    """Below the API (flashtrain.kernels called directly) a strided table is refused."""
    from flashtrain.kernels.common import UNBOUNDED
    from flashtrain.kernels.flash_decode import flash_decode

    q, kc = torch.randn(2, 1, 2, 8), torch.randn(2, 10, 2, 8)
    lens = torch.tensor([4, 6], dtype=torch.int32)
    common = dict(cache_batch_idx=None, softmax_scale=0.3, window_left=UNBOUNDED, window_right=0)
    out, lse = torch.empty_like(q), torch.empty(2, 2, 1)
    for name, bad in (
        ("seqlens_k", dict(seqlens_k=_strided([4, 6], junk=0))),
        ("cache_batch_idx", dict(cache_batch_idx=_strided([1, 0], junk=0))),
        ("cache_leftpad", dict(cache_leftpad=_strided([1, 0], junk=0))),
    ):
        kwargs = {**common, "seqlens_k": lens, **bad}
        with pytest.raises(ValueError, match=f"{name} must be int32 with its last dim contiguous"):
            flash_decode(q, kc, kc, out, lse, **kwargs)
    with pytest.raises(ValueError, match="block_table must be int32 with its last dim contiguous"):
        flash_decode(
            q, kc[:, :5], kc[:, :5], out, lse, lens, **common,
            block_table=_strided([[0, 1], [1, 0]], junk=0),
        )  # fmt: skip


# ------------------------------------------------------------------ masked entries


def _run(q, kc, vc, **opts):
    return flash_attn_with_kvcache(q, kc, vc, return_softmax_lse=True, **opts)


def _poison(kc, vc, slots, where, value):
    """Copies of the caches with `value` at each index in `slots`, in V (and K if `where` says)."""
    kc, vc = kc.clone(), vc.clone()
    for slot in slots:
        vc[slot] = value
        if "k" in where:
            kc[slot] = value
    return kc, vc


def _assert_unchanged(got, want, rows=(slice(None),)):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq)) equal at each (batch[, query]) index in rows."""
    for row in rows:
        index = row if isinstance(row, tuple) else (row,)
        torch.testing.assert_close(got[0][index], want[0][index], atol=1e-6, rtol=0)
        lse_index = (index[0], slice(None), *index[1:])
        torch.testing.assert_close(got[1][lse_index], want[1][lse_index], atol=1e-6, rtol=0)


POISON = pytest.mark.parametrize(
    "where, value", [("kv", float("nan")), ("v", float("inf"))], ids=["nan-kv", "inf-v"]
)


@POISON
def test_nonfinite_past_seqlens_and_in_leftpad_never_contributes(route, where, value):
    """Entry 0 uses keys 3..6 of 20 (left padding 0..2, unused slots 7..19), entry 1 keys 0..11:
    non-finite values everywhere else change nothing."""
    kc, vc = _caches(2, 20, 2, 16, seed=3)
    q = torch.randn(2, 1, 4, 16)
    opts = dict(
        cache_seqlens=torch.tensor([7, 12], dtype=torch.int32),
        cache_leftpad=torch.tensor([3, 0], dtype=torch.int32),
        causal=True,
    )
    unseen = [(0, slice(0, 3)), (0, slice(7, None)), (1, slice(12, None))]
    got = _run(q, *_poison(kc, vc, unseen, where, value), **opts)
    _assert_unchanged(got, _run(q, kc, vc, **opts))


@POISON
def test_nonfinite_outside_the_window_never_contributes(route, where, value):
    """One query at position 14 with window (4, 0): keys 0..9 are outside it."""
    kc, vc = _caches(1, 16, 1, 16, seed=4)
    q = torch.randn(1, 1, 2, 16)
    opts = dict(cache_seqlens=15, causal=True, window_size=(4, 0))
    got = _run(q, *_poison(kc, vc, [(0, 5)], where, value), **opts)
    _assert_unchanged(got, _run(q, kc, vc, **opts))


@pytest.mark.parametrize("num_splits", [1, 3])
@POISON
def test_nonfinite_past_a_rows_causal_diagonal_reaches_only_the_rows_that_see_it(
    route, where, value, num_splits
):
    """A chunk of 4 queries at positions 30..33 of a 34-key cache (GQA: 2 query heads per kv
    head, so the kernel's row tile mixes queries): key 32 is seen by queries 2, 3, not 0, 1."""
    kc, vc = _caches(1, 40, 2, 16, seed=5)
    q = torch.randn(1, 4, 4, 16)
    opts = dict(cache_seqlens=34, causal=True, num_splits=num_splits)
    got = _run(q, *_poison(kc, vc, [(0, 32)], where, value), **opts)
    _assert_unchanged(got, _run(q, kc, vc, **opts), rows=[(0, slice(0, 2))])
    for i in (2, 3):
        for h in range(4):
            assert not got[0][0, i, h].isfinite().all(), f"query {i} head {h} sees the value"


def test_nonfinite_in_unused_page_slots_never_contributes(route):
    """Pages of 5 keys: entry 0 holds 7 keys in pages 4, 1 and owns page 6 unused, entry 1
    holds 9 in pages 0, 5 and owns page 2 unused; page 3 is nobody's. NaN in every unused slot."""
    pool_k, pool_v = _caches(7, 5, 2, 16, seed=6)
    q = torch.randn(2, 1, 2, 16)
    opts = dict(
        cache_seqlens=torch.tensor([7, 9], dtype=torch.int32),
        block_table=torch.tensor([[4, 1, 6], [0, 5, 2]], dtype=torch.int32),
        causal=True,
    )
    unused = [(1, slice(2, None)), 6, (5, 4), 2, 3]
    got = _run(q, *_poison(pool_k, pool_v, unused, "kv", float("nan")), **opts)
    _assert_unchanged(got, _run(q, pool_k, pool_v, **opts))


@pytest.mark.parametrize("where", ["k", "v"])
def test_a_nonfinite_value_a_row_sees_still_makes_it_nan(route, where):
    """A decode step (one query) with a NaN in a used key (where="k": K only; "v": V only) of
    entry 0: every head of entry 0 is not finite, entry 1 is untouched."""
    kc, vc = _caches(2, 20, 1, 16, seed=7)
    q = torch.randn(2, 1, 2, 16)
    opts = dict(cache_seqlens=torch.tensor([12, 12], dtype=torch.int32), causal=True)
    k2, v2 = _poison(kc, vc, [(0, 4)], "kv", float("nan"))
    got = _run(q, k2 if where == "k" else kc, v2 if where == "v" else vc, **opts)
    assert not got[0][0].isfinite().all(dim=-1).any(), "every head of entry 0 sees the NaN"
    _assert_unchanged(got, _run(q, kc, vc, **opts), rows=[1])


# ------------------------------------------------------------------ repeated cache rows


def test_a_row_two_appending_entries_name_is_refused_and_two_readers_share_it(route):
    """flash-attn's contract: cache_batch_idx names distinct rows when k, v are appended. With
    [1, 0, 1] entries 0 and 2 would write their new key into the same slot of row 1, and entry
    0 would attend entry 2's key: refused naming the argument and the row, before any write.
    Without k, v both read row 1, each at its own length, as float64 attention does."""
    kc, vc = _caches(2, 12, 2, 16, seed=8)
    q, k, v = torch.randn(3, 1, 4, 16), torch.randn(3, 1, 2, 16), torch.randn(3, 1, 2, 16)
    rows = torch.tensor([1, 0, 1], dtype=torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    with pytest.raises(ValueError, match=r"cache_batch_idx names cache row 1 for 2 entries"):
        flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=5, cache_batch_idx=rows)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc), "nothing written"
    lens = torch.tensor([6, 9, 11], dtype=torch.int32)
    out, lse = _run(q, kc, vc, cache_seqlens=lens, cache_batch_idx=rows, causal=True)
    for entry, (row, length) in enumerate(zip(rows.tolist(), lens.tolist())):
        want_out, want_lse = attention_reference(
            q[entry : entry + 1].double(), kc[row : row + 1, :length].double(),
            vc[row : row + 1, :length].double(), causal=True,
        )  # fmt: skip
        torch.testing.assert_close(out[entry : entry + 1].double(), want_out, atol=2e-5, rtol=0)
        torch.testing.assert_close(lse[entry : entry + 1].double(), want_lse.double(), atol=1e-4,
                                   rtol=0)  # fmt: skip


# ------------------------------------------------------------------ int64 offsets, limits


@pytest.mark.slow  # ~27 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_offsets_past_2_31_give_the_reference_answer(route):
    """A head-major cache and query (head 2 starts past 2^31 elements), a 300-row query chunk
    whose rows are 2^23 - 64 elements apart, and (the kernel route) flash_decode writing a
    head-major output, with 1 and 3 splits, on storage large only in address space. In a
    subprocess (one per route): with int32 offsets the interpreter read outside the storage."""
    layouts = ["cache-heads", "q-rows"] + (["out-heads"] if route == "triton" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(SCRIPT.parent)]))
    run = subprocess.run([sys.executable, str(SCRIPT), *layouts], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-3000:]}"
    errors = json.loads(run.stdout.splitlines()[-1])
    assert len(errors) == 2 * len(layouts) and max(errors.values()) < 1e-2, (
        errors
    )  # fp16 vs float64


@pytest.mark.single_route
def test_keys_per_entry_over_the_int32_limit_are_refused_naming_it():
    q = torch.empty(1, 1, 1, 16, dtype=torch.float16, device="meta")
    long = torch.empty(1, MAX_SEQLEN + 1, 1, 16, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match=r"k_cache has seqlen 1073741824.*2\^30 - 1"):
        flash_attn_with_kvcache(q, long, long)
    pool = torch.empty(2, 2**20, 1, 16, dtype=torch.float16, device="meta")
    table = torch.zeros(1, 2**10, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"1024 pages x 1048576 keys = 1073741824 keys.*2\^30 - 1"):
        flash_attn_with_kvcache(q, pool, pool, block_table=table)
