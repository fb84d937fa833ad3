"""The tile-config sweep of the GPU suite: time each candidate forward and backward config of
kernels/tuning.py against the built-in rules, keep the fastest per (kind, head_dim, dtype), and
return it as a per-GPU table (kernels/tuning_tables/<gpu-slug>.json)."""

from __future__ import annotations

import time

import torch

from flashtrain.attention import flash_attn_func
from flashtrain.bench import baselines, measure
from flashtrain.bench.attention_rows import random_qkv
from flashtrain.kernels import tuning
from flashtrain.kernels.tuning import TileConfig

# (block_m, block_n, num_warps, num_stages); Hopper's 227 KB of shared memory fits all at
# hd <= 128 in 16-bit; a config a GPU cannot launch is recorded as failed and never chosen.
FORWARD_CANDIDATES = [
    (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 2), (128, 64, 4, 3),
    (128, 64, 8, 3), (128, 64, 4, 4), (128, 64, 8, 2), (64, 64, 4, 3),
]  # fmt: skip
# backward: block_n keys held by a dK/dV program, block_m queries streamed
BACKWARD_CANDIDATES = [
    (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2),
    (64, 128, 8, 1), (128, 128, 8, 2), (64, 128, 4, 2),
]  # fmt: skip


def _timed(kind: str, q, k, v, rep: int, device) -> float | None:
    """Summed median ms over causal and not: the forward (kind fwd) or fwd+bwd (kind bwd)."""
    total = 0.0
    for causal in (False, True):
        fwd = lambda causal=causal: flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        fn = fwd if kind == "fwd" else baselines.with_backward(fwd, (q, k, v))
        try:
            m = measure.measure(fn, rep=rep, device=device)
        except Exception as err:  # noqa: BLE001  (triton's OutOfResources is no RuntimeError)
            return _failed(err)
        if m.ms is None:
            return None
        total += m.ms
    return total


def _failed(err: Exception) -> None:
    print(f"  config failed: {type(err).__name__}: {str(err).splitlines()[0][:100]}", flush=True)


def sweep(
    *, head_dims, dtype, seqlen, tokens, rep, device, deadline: float, candidates=None
) -> tuple[dict[str, TileConfig], list[dict]]:
    """Winning configs by table key, and one row per timed (key, config) with its ratio to the
    built-in config. Stops timing new candidates at `deadline` (time.monotonic())."""
    winners: dict[str, TileConfig] = {}
    rows: list[dict] = []
    for head_dim in head_dims:
        heads = max(1, 2048 // head_dim)
        q, k, v = random_qkv(
            max(1, tokens // seqlen), seqlen, heads, head_dim, device=device, dtype=dtype
        )
        block_d = max(16, 1 << (head_dim - 1).bit_length())
        for kind, pool in (("fwd", FORWARD_CANDIDATES), ("bwd", BACKWARD_CANDIDATES)):
            key = tuning.table_key(kind, head_dim, dtype)
            builtin = _timed(kind, q, k, v, rep, device)
            best: tuple[float, TileConfig] | None = None
            for m, n, warps, stages in (candidates or {}).get(kind, pool):
                cfg = TileConfig(m, n, block_d, warps, stages)
                if time.monotonic() > deadline:
                    rows.append({"key": key, "config": cfg.__dict__, "note": "skipped: budget"})
                    continue
                with tuning.overridden(kind, cfg):
                    ms = _timed(kind, q, k, v, rep, device)
                ratio = builtin / ms if ms and builtin else None
                rows.append({"key": key, "config": cfg.__dict__, "ms": ms, "builtin_ms": builtin,
                             "speedup_vs_builtin": ratio})  # fmt: skip
                print(
                    f"  {key} {m}x{n} w{warps} s{stages}: {ms} ms (built-in {builtin})", flush=True
                )
                if ms is not None and (best is None or ms < best[0]):
                    best = (ms, cfg)
            if best is not None and (builtin is None or best[0] < builtin):
                winners[key] = best[1]
    return winners, rows


def table_for(device, winners: dict[str, TileConfig]) -> dict:
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
    return tuning.table_payload(name, winners)
