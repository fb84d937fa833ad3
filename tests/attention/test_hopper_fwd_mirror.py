"""The warp-specialized Gluon forward's schedule, checked on the CPU where the kernel cannot run:
its PyTorch mirror (flashtrain/lab/hopper_fwd_mirror.py), driven by the table the kernel's own
schedule functions write under the interpreter (kernels/hopper/fwd_schedule.py), against the
float64 definition at odd sizes, grouped-query, bottom-right causal and packed sequences; the
table itself (every query tile once, exactly the key tiles its rows see, the running counts);
masked non-finite values; its protocol (the partitions' mbarrier waits and arrivals) in random
orders. Each check fails on a planted bug: a wrong tile start or item in the schedule functions,
V not cleaned, a skipped or wrong wait, a key_term ring of one, a K, V or Q buffer released
before the products reading it retired, the output staging tile rewritten or left behind with
its store in flight, a turn the table does not count."""

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl
from kernel_testing import cu_seqlens

from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper import fwd_schedule
from flashtrain.lab import hopper_fwd_mirror as mirror
from flashtrain.lab.hopper_fwd_mirror import ProtocolError, Rules

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

SMS = 3  # an odd count of SMs: programs take several items, unevenly
TOLERANCE = 1e-10  # float64 throughout: far below any index error


def _window(causal: bool) -> int:
    return 0 if causal else UNBOUNDED


def _definition(q, k, v, scale, window_right):
    """float64 (out (B, Sq, Hq, D), lse (B, Hq, Sq)) by the definition: the band bottom-right
    aligned (row i sees key j <= i + Sk - Sq + window_right), rows that see no key 0 and -inf."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    rows = torch.arange(q.shape[1])[:, None] + k.shape[1] - q.shape[1]
    seen = torch.arange(k.shape[1])[None, :] <= rows + window_right  # (Sq, Sk)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(seen, torch.exp(s - lse[..., None]), 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _dense(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return (_randn(gen, batch, seqlen_q, heads_q, head_dim),
            _randn(gen, batch, seqlen_k, heads_kv, head_dim),
            _randn(gen, batch, seqlen_k, heads_kv, head_dim))  # fmt: skip


def _probe_dense(q, k, causal, stages=2):
    return mirror.probe_schedule(batch=q.shape[0], heads_q=q.shape[2], max_seqlen_q=q.shape[1],
                                 max_seqlen_k=k.shape[1], window_right=_window(causal), sms=SMS,
                                 stages=stages)  # fmt: skip


def _mirror(q, k, v, programs, causal, packed=False):
    return mirror.mirror_forward(q, k, v, programs, softmax_scale=q.shape[-1] ** -0.5,
                                 window_right=_window(causal), group=q.shape[2] // k.shape[2],
                                 packed=packed)  # fmt: skip


def _worst(got, truth) -> float:
    """Largest error of out and lse relative to each one's largest finite magnitude (at least
    1); equal infinities agree, NaN or a row no item wrote counts as inf."""
    worst = 0.0
    for g, t in zip(got, truth):
        off = torch.nan_to_num(torch.where(g == t, 0.0, (g.double() - t).abs()), nan=math.inf)
        finite = t[torch.isfinite(t)]
        scale = max(float(finite.abs().max()) if finite.numel() else 0.0, 1.0)
        worst = max(worst, float(off.max()) / scale if off.numel() else 0.0)
    return worst


DENSE_CASES = [
    (2, 200, 200, 4, 2, 32),  # GQA 2, both tails partial
    (1, 333, 333, 4, 1, 16),  # GQA 4 (MQA), three query tiles
    (1, 200, 333, 2, 1, 64),  # head_dim 64; Sq < Sk: the diagonal off the tile grid
    (1, 300, 140, 2, 2, 16),  # Sq > Sk: causal rows and tiles that see no key
    (3, 1, 1, 2, 1, 16),  # one token per sequence
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim", DENSE_CASES)
def test_mirror_matches_the_definition(causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                       head_dim):  # fmt: skip
    q, k, v = _dense(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, 1)
    truth = _definition(q, k, v, head_dim**-0.5, _window(causal))
    assert _worst(_mirror(q, k, v, _probe_dense(q, k, causal), causal), truth) < TOLERANCE


PACKED_LENGTHS = {
    "self": ([1, 128, 200, 0, 37, 256], [1, 128, 200, 0, 37, 256]),
    # keys != queries per document: longer, shorter, none at all (n_tiles 0: zeros, -inf)
    "cross": ([1, 128, 200, 0, 37, 256], [5, 300, 128, 3, 0, 129]),
}


def _packed(lens_q, lens_k, heads_q, heads_kv, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return (_randn(gen, 1, sum(lens_q), heads_q, head_dim),
            _randn(gen, 1, sum(lens_k), heads_kv, head_dim),
            _randn(gen, 1, sum(lens_k), heads_kv, head_dim))  # fmt: skip


def _probe_packed(lens_q, lens_k, heads_q, causal, stages=2):
    return mirror.probe_schedule(batch=len(lens_q), heads_q=heads_q, max_seqlen_q=max(lens_q),
                                 max_seqlen_k=max(lens_k), window_right=_window(causal), sms=SMS,
                                 stages=stages, cu_seqlens_q=cu_seqlens(lens_q),
                                 cu_seqlens_k=cu_seqlens(lens_k))  # fmt: skip


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("lengths", PACKED_LENGTHS.values(), ids=PACKED_LENGTHS.keys())
def test_packed_sequences_match_the_definition(causal, lengths):
    """Packed documents of uneven lengths (one token, a multiple of 128, none), GQA: each
    document's rows from its cu_seqlens, never another document's keys."""
    lens_q, lens_k = lengths
    heads_q, heads_kv, head_dim = 4, 2, 16
    q, k, v = _packed(lens_q, lens_k, heads_q, heads_kv, head_dim, 2)
    cu_q, cu_k = cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist()
    out = torch.zeros_like(q)
    lse = torch.zeros(heads_q, sum(lens_q), dtype=torch.float64)
    for i in range(len(lens_q)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        out[:, rows], part = _definition(q[:, rows], k[:, keys], v[:, keys], head_dim**-0.5,
                                         _window(causal))  # fmt: skip
        lse[:, rows] = part[0]
    programs = _probe_packed(lens_q, lens_k, heads_q, causal)
    assert _worst(_mirror(q, k, v, programs, causal, packed=True), (out, lse)) < TOLERANCE


# ------------------------------------------------------------------ the table
SCHEDULE_CASES = {
    "fixed-causal": (False, True, [200, 200], [333, 333], 3),
    "fixed-full": (False, False, [333], [200], 2),
    "fixed-causal-sq>sk": (False, True, [300], [140], 2),
    "packed-causal": (True, True, [1, 128, 200, 0, 37, 256], [5, 300, 128, 3, 0, 129], 2),
    "packed-full": (True, False, [1, 128, 200, 0, 37, 256], [1, 128, 200, 0, 37, 256], 3),
}


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("case", SCHEDULE_CASES.values(), ids=SCHEDULE_CASES.keys())
def test_the_table_covers_every_query_tile_once_with_the_keys_it_sees(case, stages):
    packed, causal, lens_q, lens_k, heads_q = case
    right = _window(causal)
    if packed:
        programs = _probe_packed(lens_q, lens_k, heads_q, causal, stages)
        starts_q, starts_k = cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist()
    else:
        q, k = torch.empty(len(lens_q), lens_q[0], heads_q, 1), torch.empty(1, lens_k[0], 1, 1)
        programs = _probe_dense(q, k, causal, stages)
        starts_q = starts_k = [0] * (len(lens_q) + 1)
    assert len(programs) == min(SMS, triton.cdiv(max(lens_q), 128) * heads_q * len(lens_q))
    taken = Counter()
    for prog in programs:
        kv = turn = masked = 0
        for local, item in enumerate(prog.items):
            b = item.b
            taken[b, item.h, item.m0] += 1
            assert (item.q_start, item.seqlen_q) == (starts_q[b], lens_q[b])
            assert (item.k_start, item.seqlen_k) == (starts_k[b], lens_k[b])
            assert (item.q_slot, item.q_parity, item.turn) == (local % 2, local // 2 & 1, turn)
            assert item.n_tiles == len(item.tiles)
            flags = [tile.masked for tile in item.tiles]
            assert flags == sorted(flags, reverse=True)  # the masked tiles first
            assert sorted(t.start_n for t in item.tiles) == _tiles_seen(item, right)
            for t, tile in enumerate(item.tiles):
                assert (tile.kv, tile.kv_slot, tile.kv_parity) == (kv, kv % stages,
                                                                   kv // stages & 1)  # fmt: skip
                assert tile.turn == turn + t  # its P V's issue: S_0 takes no turn
                clean = (masked % 2, masked // 2 & 1) if tile.masked else (-1, -1)
                assert (tile.clean_slot, tile.clean_parity) == clean
                if not tile.masked:
                    end = (tile.start_n, tile.start_n + 128)
                    assert _allowed(item, item.m0, item.m0 + 128, *end, right).all()
                kv, masked = kv + 1, masked + tile.masked
            turn += item.n_tiles
    every = Counter((b, h, m0) for b, n in enumerate(lens_q) for h in range(heads_q)
                    for m0 in range(0, n, 128))  # fmt: skip
    assert taken == every


def _allowed(item, first_row, end_row, start_n, end_n, right) -> torch.Tensor:
    """kernels/band.py `allowed` for rows [first_row, end_row), keys [start_n, end_n)."""
    rows = torch.arange(first_row, end_row)[:, None] + item.seqlen_k - item.seqlen_q
    cols = torch.arange(start_n, end_n)[None, :]
    return (cols < item.seqlen_k) & (cols <= rows + right)


def _tiles_seen(item, right) -> list[int]:
    """The 128-key tiles holding a key that some row of the item (inside its sequence) sees."""
    rows = (item.m0, min(item.m0 + 128, item.seqlen_q))
    seen = _allowed(item, *rows, 0, item.seqlen_k, right).any(dim=0)
    return sorted({int(j) // 128 * 128 for j in seen.nonzero().flatten()})


# ------------------------------------------------------------------ masked non-finite values
def _nonfinite_case(what):
    """A causal batch of one with a non-finite value at key `at` (in the masked diagonal tile
    of query tile 128): rows < at cannot see it. inf in K turns a score +inf only where q's
    entry is positive (so it is, here); a -inf score would leave the row finite."""
    q, k, v = _dense(1, 190, 190, 2, 1, 16, 7)
    q[..., 3] = q[..., 3].abs() + 0.5
    at = 150 if what == "nan-v" else 160
    bad_k, bad_v = k.clone(), v.clone()
    (bad_v if what == "nan-v" else bad_k)[0, at, 0, 3] = math.nan if what == "nan-v" else math.inf
    return q, (k, v), (bad_k, bad_v), at


def _check_nonfinite(what):
    q, clean, bad, at = _nonfinite_case(what)
    programs = _probe_dense(q, clean[0], True)
    out, lse = _mirror(q, *bad, programs, True)
    clean_out, clean_lse = _mirror(q, *clean, programs, True)
    assert torch.equal(out[0, :at], clean_out[0, :at]) and torch.equal(lse[0, :, :at],
                                                                       clean_lse[0, :, :at])  # fmt: skip
    assert torch.isnan(out[0, at:]).all() and torch.isnan(lse[0, :, at:]).all()


@pytest.mark.parametrize("what", ["nan-v", "inf-k"])
def test_masked_nonfinite_values_never_contribute(what):
    """NaN in V or inf in K at a key past some rows' causal diagonal, inside a masked tile:
    the rows that cannot see it are exactly the clean result, the rows that see it NaN
    (docs/attention_semantics.md)."""
    _check_nonfinite(what)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("packed", [False, True], ids=["fixed", "packed"])
def test_the_next_sequences_rows_never_leak(causal, packed):
    """A sequence's last tiles read past its end into the next sequence's rows (one descriptor
    over the batch): a NaN there, in Q, K or V, leaves the sequence's output exact."""
    if packed:
        q, k, v = _packed([200, 100], [200, 100], 2, 1, 16, 5)
        programs = _probe_packed([200, 100], [200, 100], 2, causal)
        first, nxt = (0, slice(0, 200)), (0, 200)
    else:
        q, k, v = _dense(2, 200, 200, 2, 1, 16, 5)
        programs = _probe_dense(q, k, causal)
        first, nxt = (0, slice(None)), (1, 0)
    clean = _mirror(q, k, v, programs, causal, packed)
    q, k, v = q.clone(), k.clone(), v.clone()
    q[nxt], k[nxt], v[nxt] = math.nan, math.inf, math.nan
    out, lse = _mirror(q, k, v, programs, causal, packed)
    assert torch.equal(out[first], clean[0][first]) and torch.isfinite(out[first]).all()
    lse_first = (slice(None), first[1]) if packed else (0,)
    assert torch.equal(lse[lse_first], clean[1][lse_first])


# ------------------------------------------------------------------ planted bugs
@triton.jit
def _plan_key_tile_middle_late(bounds, n_masked, t, BLOCK_N: tl.constexpr):
    """plan_key_tile with an index bug: the unmasked middle starts one tile late."""
    start, masked = fwd_schedule._correct(bounds, n_masked, t, BLOCK_N)
    return tl.where(masked, start, start + BLOCK_N), masked


@triton.jit
def _work_item_a_tile_late(item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K,
                           seqlen_q_fixed, seqlen_k_fixed, window_right, BLOCK_M: tl.constexpr,
                           IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr):  # fmt: skip
    """work_item with an index bug: m0 one tile late."""
    m0, b, h, q_start, seqlen_q, k_start, seqlen_k, band = fwd_schedule._correct(
        item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
        seqlen_k_fixed, window_right, BLOCK_M, IS_VARLEN, HEAVY_FIRST)  # fmt: skip
    return m0 + BLOCK_M, b, h, q_start, seqlen_q, k_start, seqlen_k, band


@triton.jit
def _query_tile_plan_one_edge_unmasked(m0, seqlen_k, band, BLOCK_M: tl.constexpr,
                                       BLOCK_N: tl.constexpr):  # fmt: skip
    """query_tile_plan with an index bug: one masked tile fewer."""
    bounds, n_masked, n_tiles = fwd_schedule._correct(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
    return bounds, tl.maximum(n_masked - 1, 0), n_tiles


@pytest.mark.parametrize(
    "name, wrong, causal",
    [
        ("plan_key_tile", _plan_key_tile_middle_late, False),
        ("work_item", _work_item_a_tile_late, True),
        ("query_tile_plan", _query_tile_plan_one_edge_unmasked, True),
    ],
)
def test_a_bug_planted_in_the_kernels_schedule_functions_fails(monkeypatch, name, wrong, causal):
    """The table comes from the functions the Gluon kernel calls: break one there and the mirror
    fails, with no edit to the mirror."""
    q, k, v = _dense(1, 333, 333, 2, 1, 16, 11)
    truth = _definition(q, k, v, 16**-0.5, _window(causal))
    assert _worst(_mirror(q, k, v, _probe_dense(q, k, causal), causal), truth) < TOLERANCE
    monkeypatch.setattr(fwd_schedule, "_correct", getattr(fwd_schedule, name), raising=False)
    monkeypatch.setattr(fwd_schedule, name, wrong)
    assert _worst(_mirror(q, k, v, _probe_dense(q, k, causal), causal), truth) > 1e-3


def test_skipping_the_cleaning_of_v_fails(monkeypatch):
    """Without V cleaned, the masked NaN reaches the rows that cannot see it (0 * NaN)."""
    monkeypatch.setattr(mirror, "_clean_values", lambda v: (v, torch.zeros(v.shape[0])))
    with pytest.raises(AssertionError):
        _check_nonfinite("nan-v")


# ------------------------------------------------------------------ the protocol
def _protocol_programs(stages):
    """Programs with every kind of item: two masked tiles in a row (Sk - Sq off the tile grid),
    items without keys (alone and between others), one of a single token, unmasked middles."""
    programs = _probe_packed([200, 5, 300, 1], [333, 0, 300, 1], 2, True, stages)
    programs += _probe_packed([5, 200, 5, 5], [0, 130, 0, 0], 2, True, stages)
    items = [item for prog in programs for item in prog.items]
    assert any(t.masked and u.masked for i in items for t, u in zip(i.tiles, i.tiles[1:]))
    assert any(i.n_tiles == 0 for i in items) and any(i.n_tiles > 2 for i in items)
    return programs


@pytest.mark.parametrize("stages", [2, 3])
def test_protocol_runs_every_item_in_turn(stages):
    for prog in _protocol_programs(stages):
        for seed in range(200):
            assert mirror.simulate_protocol(prog, stages, seed) > 0


def _fails_for_some_seed(rules: Rules, stages: int = 2) -> None:
    with pytest.raises(ProtocolError):
        for prog in _protocol_programs(stages):
            for seed in range(200):
                mirror.simulate_protocol(prog, stages, seed, rules)


PLANTED_RULES = {
    "consumer-1-skips-cleaned": Rules(clean_ready=lambda tile: None),
    "key-term-ring-of-1": Rules(clean_slot=lambda tile: 0, clean_ready=lambda t: t.clean_slot),
    "consumer-0-cleans-v-before-it-lands": Rules(clean_v_ready=lambda tile: None),
    "loader-skips-k-empty": Rules(loader_k_free=lambda tile: None),
    "loader-skips-v-empty": Rules(loader_v_free=lambda tile: None),
    "k-released-before-s": Rules(k_after_s=False),
    "v-released-before-pv": Rules(v_after_pv=False),
    "q-released-before-the-last-s": Rules(q_after_last_s=False),
    "turn-both-as-wg0": Rules(turn_parity=lambda turn, w: (turn & 1) ^ 1),
    "turn-both-as-wg1": Rules(turn_parity=lambda turn, w: turn & 1),
    "first-s-takes-a-turn": Rules(first_s_in_turn=True),
    "consumer-k-ready-parity": Rules(consumer_k_ready=lambda tile: tile.kv_parity ^ 1),
    "pv-skips-v-ready": Rules(consumer_v_ready=lambda tile: None),
    "consumer-skips-q-ready": Rules(consumer_q_ready=lambda item: None),
    # an item without keys reads no Q, but its release still counts in the Q buffer's phase
    "keyless-item-skips-q-ready": Rules(
        consumer_q_ready=lambda i: i.q_parity if i.n_tiles else None
    ),
    "loader-q-empty-parity": Rules(loader_q_free=lambda item: item.q_parity),
    "o-staging-rewritten-before-its-store": Rules(o_store_waited=False),
    "no-final-store-wait": Rules(final_store_wait=False),
}


@pytest.mark.parametrize("rules", PLANTED_RULES.values(), ids=PLANTED_RULES.keys())
def test_protocol_fails_on_a_planted_bug(rules):
    _fails_for_some_seed(rules)


def test_a_turn_off_by_one_in_the_table_fails():
    """The turn column sets the ping-pong parities: one item's turns one late break it."""
    late = lambda i: replace(i, turn=i.turn + 1, tiles=tuple(replace(t, turn=t.turn + 1)
                                                             for t in i.tiles))  # fmt: skip
    programs = [replace(p, items=(p.items[0], late(p.items[1]), *p.items[2:]))
                for p in _protocol_programs(2) if len(p.items) > 2]  # fmt: skip
    with pytest.raises(ProtocolError):
        for prog in programs:
            for seed in range(200):
                mirror.simulate_protocol(prog, 2, seed)


def test_one_kv_stage_deadlocks():
    """Consumer 0 cleans a masked tile's V_t before its own P_{t-1} V_{t-1} is waited for and
    that slot released: with one V slot, V_t never lands. STAGES must be >= 2."""
    _fails_for_some_seed(Rules(), stages=1)


def test_the_rules_turn_parity_is_the_kernels():
    assert mirror.probe_turn_parity(8) == [(Rules().turn_parity(t, 0), Rules().turn_parity(t, 1))
                                           for t in range(8)]  # fmt: skip


@triton.jit
def _turn_parity_both_first(turn, WG: tl.constexpr):
    """turn_parity with a bug: warpgroup 1 waits as warpgroup 0 does."""
    return (turn & 1) ^ 1


def test_a_parity_bug_in_the_kernels_turn_parity_fails(monkeypatch):
    monkeypatch.setattr(fwd_schedule, "turn_parity", _turn_parity_both_first)
    table = mirror.probe_turn_parity(128)  # past every turn of the programs
    _fails_for_some_seed(Rules(turn_parity=lambda turn, w: table[turn][w]))
