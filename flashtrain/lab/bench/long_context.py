"""Long-context benchmark by context-parallel mode: tokens/s of Llama-3-8B-shaped layers at
128K-1M tokens per GPU, on ONE GPU, as one rank of a P-rank context-parallel group computes them.

    python scripts/bench_long_context.py                      # 128K..1M tokens per GPU, P = 8
    python scripts/bench_long_context.py --tokens 131072 --modes ring hybrid:2x4 --budget-s 300
    python scripts/bench_long_context.py --dry                # toy sizes on CPU: the code paths

Each row runs `--layers` Llama blocks (d_model 4096, 32 heads, 8 KV heads, head_dim 128, SwiGLU
14336, RMSNorm, RoPE; flashtrain.models.llama, bf16) forward + backward over T tokens, with
model.recompute (all | offload) and model.tile_tokens (0 | N) as training sets them, and the
split attention op of one rank (flashtrain.models.split_attention, the trainer's own) over a
context of S = T * P tokens:
    ring        P steps: its own block causal, every other step half a shard by a whole one
    ulysses     one causal call over the whole S tokens with Hq / P query heads
    hybrid RxU  the ring's R steps over T * U tokens with Hq / U query heads

NOT MEASURED: the communication. This process plays one rank in a fake process group of P ranks
(torch's FakeProcessGroup): every all-to-all and P2P transfer is a no-op that returns at once,
so the rows are the per-rank compute and memory only; the ring's K/V steps and Ulysses'
all-to-alls cost link time on a real group on top (docs/context_parallel.md models it).

The attention's share of each row is timed inside it (events around the op's forward and its
backward, recompute included). Figures per layer are the stack's divided by its layers. Rows are
skipped, and said so, where --budget-s cannot fit them: each row's time is estimated from its
FLOPs at an assumed rate until a row has been measured, then at the measured one.
Results: benchmarks/results/long-context-<device>.{json,md,png} (device, torch, triton, CUDA,
commit named); --dry writes long-context-cpu-dry.* (toy sizes on CPU, no figure is a measurement).
The rows' arithmetic (shapes, each rank's calls, FLOPs): long_context_plan.py; the files:
long_context_report.py; this module runs and times them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from flashtrain.lab.bench.long_context_plan import (
    DRY_SHAPE,
    LAYOUTS,
    LLAMA3_8B,
    RECOMPUTE,
    BlockShape,
    Mode,
    RowSpec,
    busiest_ring_rank,
    parse_mode,
    plan_rows,
    row_flops,
)
from flashtrain.lab.bench.long_context_report import GIB, NOT_MEASURED, fmt, write_results
from flashtrain.lab.bench.measure import environment
from flashtrain.lab.checkout import RESULTS
from flashtrain.models.attention_layers import Attention, AttentionContext, FlashAttentionConfig
from flashtrain.models.config import LlamaConfig
from flashtrain.models.llama import Llama
from flashtrain.models.split_attention import RingAttention, UlyssesAttention

# ---- One rank of a fake process group ------------------------------------------------------


@contextlib.contextmanager
def one_rank(mode: Mode, layout: str):
    """Yields (the split attention op one rank of `mode` runs, its rank p = r * U + u), this
    process playing the busiest rank in a fake process group of P ranks whose every collective
    and P2P transfer returns at once without moving data (torch's FakeProcessGroup, made for
    "simulating per-rank behavior"). Ulysses groups are consecutive ranks, as the trainer's mesh
    lays them out. The group is destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if dist.is_initialized():
        raise RuntimeError("the long-context benchmark plays one rank of a fake process group: "
                           "run it in a process without torch.distributed initialized")  # fmt: skip
    ring_rank = busiest_ring_rank(mode.ring, layout)
    rank, u = ring_rank * mode.ulysses, mode.ulysses
    dist.init_process_group("fake", rank=rank, world_size=mode.ranks, store=FakeStore())
    try:
        cfg = FlashAttentionConfig()
        if mode.ulysses == 1:
            op = RingAttention(cfg, group=None, layout=layout)
        else:
            hybrid = mode.ring > 1
            ulysses_group = dist.new_group(list(range(rank, rank + u))) if hybrid else None
            ring_group = dist.new_group(list(range(0, mode.ranks, u))) if hybrid else None
            op = UlyssesAttention(cfg, group=ulysses_group, ring_group=ring_group,
                                  sequence_group=None, layout=layout, ring_size=mode.ring,
                                  ulysses_size=mode.ulysses, rank=rank)  # fmt: skip
        yield op, rank
    finally:
        dist.destroy_process_group()


# ---- Timing the attention inside the layers ------------------------------------------------


class _Mark(torch.autograd.Function):
    """Identity on tensors whose backward first calls `hook` (the gradient passing this point)."""

    @staticmethod
    def forward(ctx, hook, *tensors):
        ctx.hook = hook
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.hook()
        return (None, *grads)


class AttentionTimer:
    """Spans of the attention op: forward (each call, a recompute's included) and backward (from
    its output's gradient arriving to its inputs' gradients leaving, as autograd ran them).
    CUDA: events on the current stream, read after a sync; CPU: the wall clock. Each call's
    stamps travel with it (a recompute that checkpoint stops early leaves nothing dangling)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.spans: dict[str, list] = {"fwd": [], "bwd": []}

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _close(self, kind: str, call: dict) -> None:
        start = call.pop(kind, None)
        if start is not None:
            self.spans[kind].append((start, self._now()))

    def enter(self, q, k, v):
        """(this call's stamps, q, k, v marked): the forward starts now; the backward ends when
        the inputs' gradients pass the mark."""
        call = {"fwd": self._now()}
        return call, _Mark.apply(lambda: self._close("bwd", call), q, k, v)

    def exit(self, call: dict, out):
        """out, marked: the forward ends now; the backward starts when its gradient arrives."""
        self._close("fwd", call)
        return _Mark.apply(lambda: call.__setitem__("bwd", self._now()), out)[0]

    def milliseconds(self) -> dict[str, float]:
        """{"fwd": ms, "bwd": ms}, summed over the spans since reset()."""
        if self.cuda:
            torch.cuda.synchronize()
            span_ms = lambda a, b: a.elapsed_time(b)  # noqa: E731
        else:
            span_ms = lambda a, b: (b - a) * 1e3  # noqa: E731
        return {kind: sum(span_ms(a, b) for a, b in spans) for kind, spans in self.spans.items()}


class TimedAttention(Attention):
    """The model's attention op: `inner` (a split attention impl) with its spans timed."""

    Config = FlashAttentionConfig
    runs_our_kernels = True
    splits_sequence = True

    def __init__(self, inner: Attention, timer: AttentionTimer):
        super().__init__(inner.cfg)
        self.inner, self.timer = inner, timer
        self.size = inner.size  # the ranks one sequence is split over (the model may ask)

    def check_model(self, config) -> None:
        self.inner.check_model(config)

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        call, (q, k, v) = self.timer.enter(q, k, v)
        return self.timer.exit(call, self.inner(q, k, v, ctx, dropout_p))


# ---- Measuring one row ---------------------------------------------------------------------


def _pinned_bytes(cuda: bool) -> int | None:
    """Pinned host memory handed out now by torch's host allocator (CUDA runs), else None."""
    stats = getattr(torch.cuda, "host_memory_stats", None)  # not in older torch
    if not cuda or stats is None:
        return None
    return stats().get("active_bytes.current", 0)


def _layers(spec: RowSpec, shape: BlockShape, attention, device, dtype):
    """(Llama blocks as training builds them, x (1, T, C), the incoming gradient, the context)."""
    extra = {"tile_tokens": spec.tile_tokens} if spec.tile_tokens else {}
    cfg = LlamaConfig(n_layer=shape.layers, n_head=shape.n_head, n_kv_head=shape.n_kv_head,
                      d_model=shape.d_model, d_ff=shape.d_ff, vocab_size=256,
                      max_seq_len=spec.context, recompute=spec.recompute, **extra)  # fmt: skip
    with torch.device(device):  # initialised where it runs: no 8B-shaped copy on the host
        model = Llama(cfg, attention).to(dtype)
        x = torch.randn(1, spec.tokens, shape.d_model, dtype=dtype, requires_grad=True)
        grad_out = torch.randn(1, spec.tokens, shape.d_model, dtype=dtype)
        cos, sin = model.rotary_tables(torch.arange(spec.tokens)[None])  # (1, T, D/2)
    ctx = AttentionContext(causal=True, rotary=(cos[..., None, :], sin[..., None, :]))
    return model, x, grad_out, ctx


def _run_row(spec, shape, layout, device, dtype, warmup, rep) -> dict:
    timer = AttentionTimer(device)
    cuda = device.type == "cuda"
    pinned_before = _pinned_bytes(cuda)
    with one_rank(spec.mode, layout) as (op, rank):
        model, x, grad_out, ctx = _layers(spec, shape, TimedAttention(op, timer), device, dtype)

        def step() -> None:
            model.zero_grad(set_to_none=True)
            x.grad = None
            model.run_blocks(x, ctx).backward(grad_out)

        for _ in range(warmup):
            step()
        model.zero_grad(set_to_none=True)  # what the timed calls start from: no gradients held
        x.grad = None
        held = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            held = torch.cuda.memory_allocated()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        timer.reset()
        wall = time.perf_counter()
        for _ in range(rep):
            step()
        if cuda:
            end.record()
            torch.cuda.synchronize()
        ms = start.elapsed_time(end) / rep if cuda else (time.perf_counter() - wall) * 1e3 / rep
        attention = {k: v / rep for k, v in timer.milliseconds().items()}
        peak = torch.cuda.max_memory_allocated() if cuda else None
        pinned = _pinned_bytes(cuda)
    per_layer = ms / shape.layers
    model_flops, executed = row_flops(spec, shape, layout)
    return {
        "ms_per_layer": per_layer,
        "attention_fwd_ms_per_layer": attention["fwd"] / shape.layers,
        "attention_bwd_ms_per_layer": attention["bwd"] / shape.layers,
        "attention_ms_per_layer": (attention["fwd"] + attention["bwd"]) / shape.layers,
        "tokens_per_s_per_gpu_layer": spec.tokens / (per_layer / 1e3),
        "model_tflops": model_flops / (ms / 1e3) / 1e12,
        "executed_tflop_per_step": executed / 1e12,
        "emulated_rank": rank,
        "held_gib": held / GIB if held is not None else None,
        "peak_gib": peak / GIB if peak is not None else None,
        "host_pinned_bytes": None if None in (pinned, pinned_before) else pinned - pinned_before,
    }


def measure_row(spec: RowSpec, shape: BlockShape, device, dtype, *, layout: str = "zigzag",
                warmup: int = 1, rep: int = 1) -> dict:  # fmt: skip
    """One row: the stack's forward + backward, `warmup` untimed calls then `rep` timed ones.
    Figures per layer; peak: torch.cuda.max_memory_allocated over the timed calls (weights,
    input, its gradient and the incoming one included; None on CPU); host_pinned_bytes: pinned
    memory held by the model after them (offload's buffers; None on CPU); offloaded_bytes: the
    block inputs recompute=offload moves to the host per step. Out of memory: ms None, note OOM."""
    device = torch.device(device)
    block_input = spec.tokens * shape.d_model * dtype.itemsize
    offloaded = (shape.layers - 1) * block_input if spec.recompute == "offload" else 0
    row = {
        "name": spec.name, "mode": spec.mode.name, "label": spec.mode.label,
        "ring": spec.mode.ring, "ulysses": spec.mode.ulysses, "ranks": spec.mode.ranks,
        "tokens_per_gpu": spec.tokens, "context": spec.context, "recompute": spec.recompute,
        "tile_tokens": spec.tile_tokens, "layers": shape.layers, "layout": layout,
        "warmup": warmup, "rep": rep, "offloaded_bytes": offloaded, "note": "",
    }  # fmt: skip
    try:
        row.update(_run_row(spec, shape, layout, device, dtype, warmup, rep))
    except torch.cuda.OutOfMemoryError:
        row.update(ms_per_layer=None, note="OOM")
    finally:
        if device.type == "cuda":
            gc.collect()  # what an OOM's traceback kept, before the cache goes back
            torch.cuda.empty_cache()
    return row


def launch_once(mode: Mode, tokens: int, shape: BlockShape, device, dtype, layout="zigzag"):
    """One untimed forward + backward of `mode` at `tokens` (recompute=all): compiles every
    kernel the mode's rows launch (the kernels' shapes are runtime arguments)."""
    measure_row(RowSpec(mode, tokens, "all", 0), shape, device, dtype, layout=layout,
                warmup=0, rep=1)  # fmt: skip


# ---- The budget -----------------------------------------------------------------------------


class Pace:
    """Seconds a row will take: its executed FLOPs times its calls at the rate measured so far
    (`assumed_tflops` until a row is measured), plus `setup_s` (building the layers)."""

    def __init__(self, assumed_tflops: float, setup_s: float):
        self.assumed, self.setup_s = assumed_tflops, setup_s
        self.flops, self.seconds = 0.0, 0.0

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else self.assumed

    def estimate(self, spec: RowSpec, shape: BlockShape, layout: str, calls: int) -> float:
        executed = row_flops(spec, shape, layout)[1]
        return executed * calls / (self.tflops * 1e12) + self.setup_s

    def observe(self, row: dict) -> None:
        if row.get("ms_per_layer"):
            self.flops += row["executed_tflop_per_step"] * 1e12
            self.seconds += row["ms_per_layer"] * row["layers"] / 1e3


# ---- Command line ---------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=None,
        help="tokens per GPU (default 131072 262144 524288 1048576; --dry 64 128)",
    )
    p.add_argument("--ranks", type=int, default=None, help="P (default 8; --dry 4)")
    p.add_argument(
        "--modes",
        nargs="+",
        default=["ring", "ulysses", "hybrid"],
        help="ring, ulysses, hybrid (2 x P/2) or hybrid:RxU",
    )
    p.add_argument("--recompute", nargs="+", default=["all", "offload"], choices=RECOMPUTE)
    p.add_argument(
        "--tile-tokens",
        type=int,
        nargs="+",
        default=None,
        help="model.tile_tokens values, 0 = off (default 0 16384; --dry 0 32)",
    )
    p.add_argument("--layers", type=int, default=2, help="blocks per row (offload needs >= 2)")
    p.add_argument("--layout", default="zigzag", choices=LAYOUTS)
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (default 1; --dry 0)")
    p.add_argument("--rep", type=int, default=1)
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip rows whose estimated time does not fit what is left",
    )
    p.add_argument(
        "--assumed-tflops",
        type=float,
        default=300.0,
        help="the rate estimates assume until a row is measured",
    )
    p.add_argument(
        "--dry", action="store_true", help="toy sizes on CPU: every code path, no figure"
    )
    p.add_argument("--out", type=Path, default=RESULTS)  # fmt: skip
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 0 if args.dry else 1
    if args.layers < 1 or args.rep < 1 or args.warmup < 0:
        p.error("--layers and --rep must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry and not torch.cuda.is_available():
        print("bench_long_context: no CUDA device; --dry runs toy sizes on CPU (no figures)",
              file=sys.stderr)  # fmt: skip
        return 2
    dry = args.dry
    device = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    base = DRY_SHAPE if dry else LLAMA3_8B
    shape = BlockShape(**{**asdict(base), "layers": args.layers})
    ranks = args.ranks or (4 if dry else 8)
    tokens = args.tokens or ([64, 128] if dry else [131072, 262144, 524288, 1048576])
    tiles = args.tile_tokens or ([0, 32] if dry else [0, 16384])
    try:
        modes = [parse_mode(m, ranks) for m in args.modes]
        specs = plan_rows(modes, tokens, args.recompute, tiles, shape, args.layout)
    except ValueError as err:
        print(f"bench_long_context: {err}", file=sys.stderr)
        return 2
    pace = Pace(args.assumed_tflops if not dry else 0.01, setup_s=0.0 if dry else 2.0)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    total = sum(pace.estimate(s, shape, args.layout, args.warmup + args.rep) for s in specs)
    print(f"{len(specs)} rows, about {total:.0f} s at an assumed {pace.tflops:g} TFLOP/s; "
          f"{NOT_MEASURED}", flush=True)  # fmt: skip
    rows, skipped = [], []
    for spec in specs:
        estimate = pace.estimate(spec, shape, args.layout, args.warmup + args.rep)
        left = deadline - time.monotonic() if deadline else None
        if left is not None and estimate > left:
            skipped.append({"name": spec.name, "estimated_s": estimate, "left_s": left,
                            "tflops": pace.tflops})  # fmt: skip
            print(f"{spec.name}: skipped (estimated {estimate:.0f} s, {left:.0f} s left)")
            continue
        row = measure_row(spec, shape, device, dtype, layout=args.layout, warmup=args.warmup,
                          rep=args.rep)  # fmt: skip
        pace.observe(row)
        rows.append(row)
        print(f"{spec.name}: {fmt(row.get('ms_per_layer'))} ms/layer (attention "
              f"{fmt(row.get('attention_ms_per_layer'))}), peak "
              f"{fmt(row.get('peak_gib'), 2)} GiB {row['note']}", flush=True)  # fmt: skip
    setup = {"shape": asdict(shape), "layers": shape.layers, "layout": args.layout,
             "dtype": str(dtype).removeprefix("torch."), "warmup": args.warmup, "rep": args.rep,
             "budget_s": args.budget_s, "assumed_tflops": args.assumed_tflops,
             "not_measured": NOT_MEASURED}  # fmt: skip
    name = write_results(rows, skipped, setup, environment(), args.out, dry)
    print(f"wrote {name}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
