"""Timing of the warp-specialized Gluon backward for the GPU suite's hopper section: side by
side with today's default flashtrain backward, SDPA's FlashAttention-2 and cuDNN backends and
FlexAttention on a dense mask (fwd, bwd = fwd+bwd minus fwd, and fwd+bwd rows:
bench/attention_rows.py), and its per-GPU table entry, judged as the tile sweep judges a config
(tile_sweep.compare_to_builtin).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, replace

from flashtrain.kernels import tuning
from flashtrain.lab.bench import baselines, results, tile_sweep, ws_route
from flashtrain.lab.bench.attention_rows import bench_method, skipped_rows

GLUON_METHOD = "flashtrain_gluon"  # flashtrain's forward, the Gluon backward
OURS = (GLUON_METHOD, "flashtrain")


def methods(q, k, v, *, causal: bool, names) -> dict:
    """name -> (forward, inputs) or why it cannot run here (baselines.dense_methods); the Gluon
    method is flashtrain's forward closure, its backward run under the variant config by
    method_rows. q, k, v: (B, S, H, D) leaves that require grad."""
    built = baselines.dense_methods(q, k, v, causal=causal,
                                    names=tuple(n for n in names if n != GLUON_METHOD))  # fmt: skip
    built[GLUON_METHOD] = built["flashtrain"]
    return {name: built[name] for name in names}


def method_rows(name: str, method, dims, causal: bool, rep: int, device, *,
                require_gluon: bool) -> list[dict]:  # fmt: skip
    """The fwd, fwd_bwd and bwd rows of one method (bench_method). Ours carry kernel and route
    (which backward ran, ws_route); where require_gluon, a Gluon row the route declines raises,
    so a fallback is never timed as the Gluon kernel. An error in ours raises; a baseline's is
    a note."""
    if isinstance(method, str):  # a baseline that cannot run here: a finished row
        return skipped_rows(name, method, dims, causal)
    forward, inputs = method
    if name not in OURS:
        return bench_method(name, forward, inputs, dims, causal, rep, device=device)
    gluon = name == GLUON_METHOD
    config = tuning.overridden("dkdv", ws_route.variant_config()) if gluon else None
    with config or contextlib.nullcontext():
        kernel, reason = ws_route.backward_route(*inputs, causal=causal)
        if gluon and require_gluon and kernel != ws_route.GLUON:
            raise RuntimeError(f"the route declined the Gluon backward: {reason}")
        rows = bench_method(name, forward, inputs, dims, causal, rep, device=device,
                            baseline=False)  # fmt: skip
    return [dict(r, kernel=kernel, route=reason) for r in rows]


def table_check(head_dim: int, dtype, *, seqlen: int, tokens: int, rep: int, device,
                require_gluon: bool, verified: bool) -> dict:  # fmt: skip
    """The Gluon config for key dkdv/<head_dim>/<dtype> on the sweep's inputs and measure: its
    time vs the built-in config's, after its results agree with them (tile_sweep's gate).
    "winner": it agrees, is faster, the route gave it the Gluon kernel, and `verified` (every
    correctness check of the section passed). Where require_gluon, a declined route raises."""
    q, k, v = tile_sweep.sweep_inputs(head_dim, dtype, seqlen, tokens, device)
    config = replace(ws_route.variant_config(), block_d=tuning.block_d_for(head_dim))
    row = {"key": tuning.table_key("dkdv", head_dim, dtype), "config": asdict(config)}
    with tuning.overridden("dkdv", config):
        declined = ws_route.sweep_declines("dkdv", q, k, v)
    if declined and require_gluon:
        raise RuntimeError(f"the route declined the Gluon backward: {declined}")
    if declined:
        return dict(row, winner=False, route=declined,
                    note=f"not timed: the route declines it ({declined})")  # fmt: skip
    verdict = tile_sweep.compare_to_builtin("dkdv", config, q, k, v, rep, device)
    winner = verdict["faster"] and verified
    note = "" if verified else "not written: a correctness check of this section did not pass"
    return dict(row, **verdict, winner=winner, route=None, note=note)


def write_winners(path, device_name: str, rows: list[dict]) -> dict | None:
    """The winners of `rows` (table_check) merged into the per-GPU table at `path` (its other
    entries kept: the sweep writes the same file); the table written, or None if no winner."""
    winners = {r["key"]: tuning.TileConfig(**r["config"]) for r in rows if r.get("winner")}
    if not winners:
        return None
    table = tile_sweep.merged_table(path, device_name, winners)
    results.write_json(path, table)
    return table
