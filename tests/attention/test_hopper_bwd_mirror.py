"""The warp-specialized Gluon backward's schedule, checked on the CPU where the kernel cannot run:
its PyTorch mirror (flashtrain/lab/hopper_bwd_mirror.py), driven by the table the kernel's own
schedule functions write under the interpreter (kernels/hopper/schedule.py), against the
float64 definition at odd sizes, grouped-query and packed sequences; its protocol (the
partitions' mbarrier waits and arrivals) in random orders. Each check fails on a planted bug:
a wrong tile start, a dropped item, a wrong head, a tile not masked, a wrong barrier parity,
a dS^T half or a staging tile reused too early, K overwritten while a dQ product reads it."""

import math

import pytest
import torch
import triton
import triton.language as tl
from kernel_testing import cu_seqlens

from flashtrain.attention.reference import attention_reference
from flashtrain.kernels.hopper import schedule
from flashtrain.lab import hopper_bwd_mirror as mirror
from flashtrain.lab.hopper_bwd_mirror import Item, Program, ProtocolError, Rules

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def _definition(q, k, v, dout, scale, causal):
    """float64 (out, lse, dq, dk, dv) of one dense batch (B, S, H, D) by the definition."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.double())
    return out.detach(), lse.detach(), dq.detach(), dk.detach(), dv.detach()


def _stats(out, dout, lse):
    """The kernel's inputs beside q, k, v: lse (B, H, S) and delta = rowsum(dO * O), alike."""
    return lse.contiguous(), (out * dout.double()).sum(-1).permute(0, 2, 1).contiguous()


def _dense_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(batch, s, h, head_dim, generator=gen, dtype=torch.float64)
                     for s, h in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv),
                                  (seqlen_q, heads_q)))  # fmt: skip
    scale = head_dim**-0.5
    out, lse, *truth = _definition(q, k, v, dout, scale, causal)
    lse, delta = _stats(out, dout, lse)
    return (q, k, v, dout, lse, delta, scale), truth


def _probe_dense(q, k, causal, block_m, stages=2):
    return mirror.probe_schedule(
        batch=q.shape[0], heads_kv=k.shape[2], group=q.shape[2] // k.shape[2],
        max_seqlen_q=q.shape[1], max_seqlen_k=k.shape[1], causal=causal, block_m=block_m,
        stages=stages,
    )  # fmt: skip


def _mirror(case, programs, causal, block_m, dq_adds="bulk"):
    q, k, v, dout, lse, delta, scale = case
    return mirror.mirror_backward(q, k, v, dout, lse, delta, programs, softmax_scale=scale,
                                  causal=causal, block_m=block_m, dq_adds=dq_adds)  # fmt: skip


def _worst(got, truth) -> float:
    """Largest error of dq, dk, dv relative to each one's largest magnitude (NaN: inf)."""
    worst = 0.0
    for g, t in zip(got, truth):
        off = float((g.double() - t).abs().max()) / max(float(t.abs().max()), 1e-12)
        worst = max(worst, off if off == off else math.inf)
    return worst


TOLERANCE = 1e-6  # float64 products; dQ passes through the kernel's float32 staging and sum


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, block_m",
    [
        (2, 200, 333, 4, 2, 64, 64),  # GQA, Sq != Sk, every tail partial
        (1, 333, 140, 3, 1, 64, 128),  # MQA, Sq > Sk (causal rows that see no key), 128-row tiles
        (1, 129, 129, 2, 2, 128, 64),  # head_dim 128, one key past a tile
    ],
)
def test_mirror_matches_the_definition(causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                       head_dim, block_m):  # fmt: skip
    case, truth = _dense_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, 1)
    programs = _probe_dense(case[0], case[1], causal, block_m)
    assert _worst(_mirror(case, programs, causal, block_m), truth) < TOLERANCE


def test_packed_sequences_match_the_definition():
    """Packed documents of odd lengths (an empty one, one past several key tiles), GQA, causal:
    each sequence's tiles from its cu_seqlens, never another sequence's rows."""
    lens_q, lens_k = [70, 0, 191, 5], [130, 17, 191, 260]
    heads_q, heads_kv, head_dim, scale = 4, 2, 64, 0.125
    gen = torch.Generator().manual_seed(3)
    make = lambda n, h: torch.randn(n, h, head_dim, generator=gen, dtype=torch.float64)
    q, k, v, dout = make(sum(lens_q), heads_q), make(sum(lens_k), heads_kv), \
        make(sum(lens_k), heads_kv), make(sum(lens_q), heads_q)  # fmt: skip
    truth = [torch.zeros_like(t) for t in (q, k, v)]
    lse = torch.zeros(heads_q, sum(lens_q), dtype=torch.float64)
    delta = torch.zeros_like(lse)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    for i in range(len(lens_q)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            continue
        out, l, dq, dk, dv = _definition(q[None, rows], k[None, keys], v[None, keys],
                                         dout[None, rows], scale, True)  # fmt: skip
        for whole, part, where in zip(truth, (dq, dk, dv), (rows, keys, keys)):
            whole[where] = part[0]
        lse[:, rows] = l[0]
        delta[:, rows] = (out[0] * dout[rows]).sum(-1).T
    programs = mirror.probe_schedule(
        batch=len(lens_q), heads_kv=heads_kv, group=heads_q // heads_kv,
        max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=True, block_m=64, stages=2,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
    )  # fmt: skip
    got = mirror.mirror_backward(q[None], k[None], v[None], dout[None], lse, delta, programs,
                                 softmax_scale=scale, causal=True, block_m=64)  # fmt: skip
    assert _worst([g[0] for g in got], truth) < TOLERANCE


def test_both_dq_writers_add_the_same():
    """Triton 3.6's per-element chunks and the bulk reduce-add give one dQ."""
    case, truth = _dense_case(1, 150, 150, 2, 1, 64, True, 5)
    programs = _probe_dense(case[0], case[1], True, 64)
    bulk = _mirror(case, programs, True, 64, "bulk")
    atomic = _mirror(case, programs, True, 64, "atomic")
    assert torch.equal(bulk[0], atomic[0]) and _worst(atomic, truth) < TOLERANCE


def test_masked_nonfinite_values_never_contribute():
    """NaN in K and V at keys a row does not see (past its causal diagonal) leaves that row's dQ
    finite and exact; the rows that see them get NaN (docs/attention_semantics.md)."""
    case, _ = _dense_case(1, 190, 190, 2, 1, 64, True, 7)
    q, k, v, dout, lse, delta, scale = case
    k, v = k.clone(), v.clone()
    k[0, 150, 0, 3] = float("nan")
    v[0, 160, 0, 5] = float("inf")
    programs = _probe_dense(q, k, True, 64)
    dq, dk, dv = _mirror((q, k, v, dout, lse, delta, scale), programs, True, 64)
    clean_dq = _mirror(case, programs, True, 64)[0]
    assert torch.equal(dq[0, :150], clean_dq[0, :150])  # rows that see neither bad key
    assert torch.isnan(dq[0, 150:]).all(dim=-1).all()  # every row that sees the NaN key
    assert torch.isfinite(dk[0, :150]).all() and torch.isfinite(dv[0, :150]).all()


# ------------------------------------------------------------------ planted bugs
def _one_tile_off(programs: list[Program]) -> list[Program]:
    return _edit_first_item(programs, lambda item: Item(**{**item.__dict__,
                                                          "start_m": item.start_m + 64}))  # fmt: skip


def _wrong_head(programs: list[Program]) -> list[Program]:
    return _edit_first_item(programs, lambda item: Item(**{**item.__dict__, "head": item.head ^ 1}))


def _unmasked_edge(programs: list[Program]) -> list[Program]:
    return _edit_first_item(programs, lambda item: Item(**{**item.__dict__, "masked": False}))


def _dropped_item(programs: list[Program]) -> list[Program]:
    first = next(i for i, p in enumerate(programs) if p.items)
    cut = Program(**{**programs[first].__dict__, "items": programs[first].items[:-1]})
    return programs[:first] + [cut] + programs[first + 1 :]


def _edit_first_item(programs, edit) -> list[Program]:
    """The first program with a masked item, that item edited."""
    for i, prog in enumerate(programs):
        for j, item in enumerate(prog.items):
            if item.masked:
                items = prog.items[:j] + (edit(item),) + prog.items[j + 1 :]
                return (
                    programs[:i]
                    + [Program(**{**prog.__dict__, "items": items})]
                    + programs[i + 1 :]
                )
    raise AssertionError("no masked item to edit")


@pytest.mark.parametrize("plant", [_one_tile_off, _wrong_head, _unmasked_edge, _dropped_item])
def test_a_planted_schedule_bug_fails(plant):
    case, truth = _dense_case(1, 200, 200, 2, 1, 64, True, 9)
    programs = _probe_dense(case[0], case[1], True, 64)
    assert _worst(_mirror(case, programs, True, 64), truth) < TOLERANCE
    assert _worst(_mirror(case, plant(programs), True, 64), truth) > 1e-3


@triton.jit
def _plan_tile_skipping_the_middle(bounds, n_masked, t, BLOCK_M: tl.constexpr):
    """plan_tile with an index bug: the unmasked segment starts one tile late."""
    start, masked = schedule._correct_plan_tile(bounds, n_masked, t, BLOCK_M)
    return tl.where(masked, start, start + BLOCK_M), masked


def test_a_bug_planted_in_the_kernels_schedule_functions_fails(monkeypatch):
    """The table comes from the functions the Gluon kernel calls: break one there and the mirror
    fails, with no edit to the mirror."""
    case, truth = _dense_case(1, 300, 300, 2, 1, 64, False, 11)
    monkeypatch.setattr(schedule, "_correct_plan_tile", schedule.plan_tile, raising=False)
    monkeypatch.setattr(schedule, "plan_tile", _plan_tile_skipping_the_middle)
    programs = _probe_dense(case[0], case[1], False, 64)
    assert _worst(_mirror(case, programs, False, 64), truth) > 1e-3


# ------------------------------------------------------------------ the protocol
def _programs_for_protocol(stages):
    q = torch.empty(1, 500, 4, 64)  # 8 tiles of 64 rows, two query heads per kv head
    k = torch.empty(1, 500, 2, 64)
    return [p for p in _probe_dense(q, k, True, 64, stages) if len(p.items) > stages]


@pytest.mark.parametrize("stages", [2, 3])
def test_protocol_runs_every_item_in_turn(stages):
    programs = _programs_for_protocol(stages)
    assert programs
    for prog in programs[:3]:
        for seed in range(20):
            mirror.simulate_protocol(prog, stages, seed)


@pytest.mark.parametrize(
    "rules",
    [
        Rules(loader_slot_free=lambda item: item.parity),  # waits for a release never coming
        Rules(consumer_slot_ready=lambda item: item.parity ^ 1),  # reads before the copy lands
        Rules(consumer_staging_free=lambda item: item.staged_parity),
        Rules(consumer_staging_free=lambda item: None),  # stages over a tile not yet added
        Rules(writer_staging_ready=lambda item: item.staged_parity ^ 1),
        Rules(consumer_ds_ready=lambda item: item.pair_parity ^ 1),
        Rules(consumer_ds_ready=lambda item: None),  # dQ before the other half is written
        Rules(ds_pair=lambda item: 0),  # one pair: a half rewritten under the other's dQ
        Rules(keys_done_waited=False),  # dK over a K half the other's dQ still reads
        Rules(slot_after_products=False),  # a slot refilled under dK's product
    ],
    ids=[
        "loader",
        "consumer-slot",
        "consumer-staging",
        "no-staging-wait",
        "writer",
        "ds-parity",
        "no-ds-wait",
        "one-ds-pair",
        "no-keys-done",
        "early-release",
    ],
)
def test_protocol_fails_on_a_planted_bug(rules):
    prog = _programs_for_protocol(2)[0]
    with pytest.raises(ProtocolError):
        for seed in range(40):
            mirror.simulate_protocol(prog, 2, seed, rules)


@triton.jit
def _ring_slot_one_phase_late(it, STAGES: tl.constexpr):
    """ring_slot with a parity bug: every use counted one phase late."""
    return it % STAGES, (it // STAGES + 1) & 1


def test_a_parity_bug_in_the_kernels_ring_fails(monkeypatch):
    monkeypatch.setattr(schedule, "ring_slot", _ring_slot_one_phase_late)
    prog = _programs_for_protocol(2)[0]
    with pytest.raises(ProtocolError):
        for seed in range(20):
            mirror.simulate_protocol(prog, 2, seed)
