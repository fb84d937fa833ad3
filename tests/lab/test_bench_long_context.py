"""The long-context benchmark (flashtrain.lab.bench.long_context, scripts/bench_long_context.py):
its dry run plays one rank of every mode end to end on CPU (offload and tiling included) and
writes its JSON and table without claiming a GPU figure; the attention calls one rank makes (ring
steps, Ulysses heads, hybrid) are right by hand for a few (P, layout) cases and are exactly the
calls the real split ops make; the attention timer spans what it says; the GPU suite's section
runs, tables its rows in summary.md, and skips (saying so) what its budget cannot fit."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from flashtrain.attention import ring as ring_module
from flashtrain.attention import ulysses as ulysses_module
from flashtrain.lab.bench import long_context as lc
from flashtrain.lab.bench import long_context_plan as plan
from flashtrain.lab.bench.flops import attention_flops
from flashtrain.lab.bench.long_context_plan import AttentionCall, BlockShape, Mode
from flashtrain.lab.gpu_suite import sections
from flashtrain.lab.gpu_suite.record import Record
from flashtrain.lab.gpu_suite.summary import derive, summary_markdown
from flashtrain.models.attention_layers import AttentionContext

LLAMA = plan.LLAMA3_8B  # 32 query heads, 8 K/V heads, head_dim 128


@pytest.fixture(autouse=True)
def torch_route(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")  # the interpreter is for kernel tests


def test_dry_run_writes_every_mode_without_gpu_figures(tmp_path):
    assert lc.main(["--dry", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "long-context-cpu-dry.json").read_text())
    assert result["dry"] and result["env"]["device"] == "cpu" and not result["skipped"]
    rows = result["rows"]
    expected = itertools.product(("ring", "ulysses", "hybrid 2x2"), (64, 128), ("all", "offload"),
                                 (0, 32))  # fmt: skip
    found = {(r["label"], r["tokens_per_gpu"], r["recompute"], r["tile_tokens"]) for r in rows}
    assert found == set(expected) and len(rows) == 24
    block_input = 64 * 4  # d_model x float32 bytes, per token
    for r in rows:
        assert r["ranks"] == 4 and r["context"] == 4 * r["tokens_per_gpu"], r
        assert 0 < r["attention_ms_per_layer"] < r["ms_per_layer"], r
        assert r["tokens_per_s_per_gpu_layer"] == pytest.approx(
            r["tokens_per_gpu"] / r["ms_per_layer"] * 1e3
        )
        assert r["peak_gib"] is None and r["host_pinned_bytes"] is None, r  # no CUDA figure
        offloaded = r["tokens_per_gpu"] * block_input if r["recompute"] == "offload" else 0
        assert r["offloaded_bytes"] == offloaded, r  # 2 layers: the first block's input
    table = (tmp_path / "long-context-cpu-dry.md").read_text()
    for piece in ("DRY RUN", "communication is NOT measured", "| hybrid 2x2 | 4 | 128 | 512 | "
                  "offload | 32 |", "| ulysses | 4 | 64 | 256 | all | - |"):  # fmt: skip
        assert piece in table, piece
    assert (tmp_path / "long-context-cpu-dry.png").stat().st_size > 1000


def test_rows_the_budget_cannot_fit_are_skipped_and_listed(tmp_path):
    argv = ["--dry", "--tokens", "64", "--modes", "ring", "ulysses", "--recompute", "all",
            "--tile-tokens", "0", "--budget-s", "1e-9", "--out", str(tmp_path)]  # fmt: skip
    assert lc.main(argv) == 0
    result = json.loads((tmp_path / "long-context-cpu-dry.json").read_text())
    assert result["rows"] == []
    assert [s["name"] for s in result["skipped"]] == ["ring P=4 T=64 all", "ulysses P=4 T=64 all"]
    table = (tmp_path / "long-context-cpu-dry.md").read_text()
    assert (
        "Skipped to fit --budget-s 1e-09" in table and "- ulysses P=4 T=64 all: estimated" in table
    )


@pytest.mark.parametrize(
    "layout, rank, steps",
    [
        ("zigzag", 0, [(8, 8, True), (4, 8, False), (4, 8, False), (4, 8, False)]),
        ("zigzag", 1, [(8, 8, True), (8, 4, False), (4, 8, False), (4, 8, False)]),
        ("zigzag", 3, [(8, 8, True), (8, 4, False), (8, 4, False), (8, 4, False)]),
        ("contiguous", 3, [(8, 8, True), (8, 8, False), (8, 8, False), (8, 8, False)]),
        ("contiguous", 1, [(8, 8, True), (8, 8, False)]),
        ("contiguous", 0, [(8, 8, True)]),
    ],
)
def test_ring_steps_of_one_rank(layout, rank, steps):
    """P = 4, 8 tokens a rank: zigzag halves every step but the diagonal (an earlier rank's early
    chunk for all rows, a later rank's shard for the late chunk); contiguous: earlier blocks whole."""
    assert plan.ring_blocks(4, 8, layout, rank) == steps


def test_each_modes_calls_heads_and_balanced_work():
    def calls(mode: str, layout: str = "zigzag", tokens: int = 16):
        return plan.rank_calls(plan.parse_mode(mode, 8), tokens, LLAMA, layout)

    assert calls("ulysses") == [AttentionCall(128, 128, 4, 1, True)]  # 8 K/V heads over 8 ranks
    assert plan.rank_calls(Mode(1, 16), 16, LLAMA, "zigzag") == [
        AttentionCall(256, 256, 2, 1, True)  # 16 ranks: each K/V head repeated twice
    ]
    assert calls("ring") == [AttentionCall(16, 16, 32, 8, True)] + 7 * [
        AttentionCall(8, 16, 32, 8, False)  # rank 0 (zigzag balances every rank)
    ]
    assert calls("hybrid") == [  # 2 x 4: the ring's 2 steps over 4 x 16 tokens, 32/4 heads
        AttentionCall(64, 64, 8, 2, True),
        AttentionCall(32, 64, 8, 2, False),
    ]
    assert calls("hybrid:4x2", "contiguous") == [AttentionCall(32, 32, 16, 4, True)] + 3 * [
        AttentionCall(32, 32, 16, 4, False)  # the last ring rank: every earlier block whole
    ]
    full = attention_flops(1, 32, 128, 128, 128, causal=True)  # the whole S = 8 x 16 sequence
    for mode in ("ring", "ulysses", "hybrid", "hybrid:4x2"):  # each rank: 1/P of it
        assert sum(c.flops(128) for c in calls(mode)) == pytest.approx(full / 8), mode


@pytest.mark.parametrize(
    "text, match",
    [
        ("hybrid:3x2", r"R \* U = P = 8"),
        ("hybrid:1x8", "R >= 2"),
        ("spiral", "allowed are ring, ulysses"),
        ("hybrid:2xfour", "allowed are ring, ulysses"),
    ],
)
def test_bad_modes_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        plan.parse_mode(text, 8)


def test_shapes_a_mode_cannot_split_are_refused(capsys):
    odd_heads = BlockShape(d_model=96, n_head=12, n_kv_head=3, d_ff=128, layers=2)
    with pytest.raises(ValueError, match="n_head must be a multiple of U"):
        plan.rank_calls(Mode(1, 8), 16, odd_heads, "zigzag")
    with pytest.raises(ValueError, match="n_kv_head must be a multiple or a divisor of U"):
        plan.rank_calls(Mode(1, 4), 16, odd_heads, "zigzag")
    with pytest.raises(ValueError, match="two equal chunks per rank: 7 tokens is odd"):
        plan.rank_calls(Mode(4, 1), 7, LLAMA, "zigzag")
    assert lc.main(["--dry", "--tokens", "7", "--modes", "ring"]) == 2  # refused before running
    assert "7 tokens is odd" in capsys.readouterr().err


@pytest.mark.parametrize(
    "mode, layout, heads",
    [
        ("ring", "zigzag", (8, 2)),
        ("ring", "contiguous", (8, 2)),
        ("ulysses", "zigzag", (8, 2)),
        ("hybrid", "zigzag", (8, 4)),
        ("hybrid", "contiguous", (8, 4)),
    ],
)
def test_the_real_split_ops_make_exactly_these_calls(monkeypatch, mode, layout, heads):
    """One forward of the trainer's split attention op, playing the busiest rank of a fake group
    of 4: the flash_attn_func calls it makes (ring steps, Ulysses' one call) are rank_calls'."""
    made = []

    def spy(real):
        def call(q, k, v, *args, **kwargs):
            made.append((q.shape[1], k.shape[1], q.shape[2], k.shape[2], kwargs.get("causal")))
            return real(q, k, v, *args, **kwargs)

        return call

    for module in (ring_module, ulysses_module):
        monkeypatch.setattr(module, "flash_attn_func", spy(module.flash_attn_func))
    shape = BlockShape(d_model=8 * heads[0], n_head=heads[0], n_kv_head=heads[1], d_ff=16,
                       layers=1)  # fmt: skip
    parsed, tokens = plan.parse_mode(mode, 4), 8
    q = torch.randn(1, tokens, heads[0], 8)
    k, v = (torch.randn(1, tokens, heads[1], 8) for _ in "kv")
    with lc.one_rank(parsed, layout) as (op, _rank):
        assert op(q, k, v, AttentionContext(causal=True)).shape == q.shape
    expected = [(c.q_len, c.k_len, c.q_heads, c.kv_heads, c.causal)
                for c in plan.rank_calls(parsed, tokens, shape, layout)]  # fmt: skip
    assert made == expected
    assert not torch.distributed.is_initialized()  # the fake group is gone


class _Slow(torch.autograd.Function):
    """Identity whose backward takes `seconds` of the test's clock (a list of one float)."""

    @staticmethod
    def forward(ctx, x, clock, seconds):
        ctx.clock, ctx.seconds = clock, seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock[0] += ctx.seconds
        return grad, None, None


def test_attention_timer_spans_forward_recompute_and_backward_only(monkeypatch):
    """Under recompute the op's forward runs twice (two spans), its backward once; work after
    the op (here a slow backward outside it) is not counted; gradients pass unchanged. On a
    clock of the test's own, which moves only where the op's work and the work after it do (a
    busy machine's pauses would add to the wall clock's spans)."""
    timer = lc.AttentionTimer(torch.device("cpu"))
    clock = [0.0]
    monkeypatch.setattr(timer, "_now", lambda: clock[0])
    w, w2 = (torch.randn(4, 4, dtype=torch.float64, requires_grad=True) for _ in "ww")

    def block(x):
        call, (q, k, v) = timer.enter(x, 2 * x, 3 * x)
        clock[0] += 0.01  # the op's forward: 10 ms
        out = timer.exit(call, _Slow.apply(q @ w + k * v, clock, 0.03))  # its backward: 30 ms
        return _Slow.apply(out @ w2, clock, 0.1)  # after the op: 100 ms not counted

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert len(timer.spans["fwd"]) == 2 and len(timer.spans["bwd"]) == 1
    ms = timer.milliseconds()
    assert ms == {"fwd": pytest.approx(20), "bwd": pytest.approx(30)}, ms
    x2 = x.detach().requires_grad_()
    expected = torch.autograd.grad(((x2 @ w + 6 * x2 * x2) @ w2).sum(), (x2, w, w2))
    for grad, want in zip((x.grad, w.grad, w2.grad), expected):
        torch.testing.assert_close(grad, want)


def test_attention_timer_survives_a_recompute_stopped_before_the_op_ends():
    """Nothing saved after the op: checkpoint's early stop ends the recompute inside it; the
    next call still pairs its own stamps."""
    timer = lc.AttentionTimer(torch.device("cpu"))
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)

    def block(x):
        call, (q, k, v) = timer.enter(x, x, x)
        return timer.exit(call, q @ w + k + v)

    for _ in range(2):
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        checkpoint(block, x, use_reentrant=False).sum().backward()
    assert len(timer.spans["bwd"]) == 2 and 2 <= len(timer.spans["fwd"]) <= 4
    assert all(b >= a for spans in timer.spans.values() for a, b in spans)


def _suite(tmp_path):
    record = Record(tmp_path, 600.0, summary_markdown, derive)
    record.state["runs"].append({"dry_run": True})
    suite = sections.Suite(record, tmp_path, True, sections.Sizes.for_run(True, 2), ())
    return suite, record.section("longctx")


def test_gpu_suite_section_measures_and_tables_its_rows(tmp_path):
    suite, sec = _suite(tmp_path)
    sections.SECTIONS["longctx"](suite, sec)
    assert sec.finish() == "done", sec.data
    rows = sec.data["rows"]
    assert [(r["label"], r["tokens_per_gpu"], r["recompute"], r["tile_tokens"]) for r in rows] == [
        (label, t, recompute, tile)
        for t in (64, 128)
        for label, recompute, tile in (("ring", "offload", 32), ("ulysses", "offload", 32),
                                       ("hybrid 2x2", "offload", 32), ("ring", "all", 0))
    ]  # fmt: skip
    assert sec.data["compile_seconds"] >= 0
    summary = (tmp_path / "summary.md").read_text()
    assert "## Long context by context-parallel mode" in summary
    assert "| hybrid 2x2 | 4 | 128 | 512 | offload | 32 |" in summary


def test_gpu_suite_section_skips_what_its_budget_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "launch_once", lambda *args, **kwargs: None)
    monkeypatch.setattr(lc.Pace, "estimate", lambda self, spec, *args, **kwargs: (
        1e6 if spec.tokens == 128 else 0.0))  # fmt: skip
    suite, sec = _suite(tmp_path)
    sections.SECTIONS["longctx"](suite, sec)
    status = sec.finish()
    assert status == "incomplete: 4 of 8 measured (budget (estimated over the time left))"
    skipped = [n for n, m in sec.data["measured"].items() if m.startswith("skipped")]
    assert skipped == [n for n in sec.data["planned"] if "T=128 " in n] and len(skipped) == 4
    assert sec.data["estimates"][skipped[0]]["estimated_s"] == 1e6
    assert (
        f"- {skipped[0]}: skipped, estimated 1000000.0 s" in (tmp_path / "summary.md").read_text()
    )
