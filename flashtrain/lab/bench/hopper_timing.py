"""Timing of the Gluon kernels for Hopper for the GPU suite's hopper section: the Gluon backward
(issue 43), the Gluon forward with the built-in backward, both (issue 46), and issue 30's
plain-Triton forward variants (the warp-specialized one-loop and the persistent forward), side
by side with today's default flashtrain kernels, SDPA's FlashAttention-2 and cuDNN backends and
FlexAttention on a dense mask (fwd, bwd = fwd+bwd minus fwd, and fwd+bwd rows:
bench/attention_rows.py); and their per-GPU table entries, judged as the tile sweep judges a
config (tile_sweep.compare_to_builtin).
"""

from __future__ import annotations

from dataclasses import asdict, replace

from flashtrain.kernels import tuning
from flashtrain.kernels.hopper import route
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab.bench import baselines, results, tile_sweep, ws_route
from flashtrain.lab.bench.attention_rows import bench_method, skipped_rows

GLUON_METHOD = "flashtrain_gluon"  # flashtrain's forward, the Gluon backward
GLUON_FWD_METHOD = "flashtrain_gluon_fwd"  # the Gluon forward, flashtrain's backward
GLUON_BOTH_METHOD = "flashtrain_gluon_both"  # the Gluon forward and the Gluon backward
WS_FWD_METHOD = "flashtrain_ws_fwd"  # issue 30's warp-specialized one-loop forward
PERSISTENT_FWD_METHOD = "flashtrain_persistent_fwd"  # issue 30's persistent forward
GLUON_KINDS = {GLUON_METHOD: ("dkdv",), GLUON_FWD_METHOD: ("fwd",),
               GLUON_BOTH_METHOD: ("fwd", "dkdv")}  # fmt: skip
ISSUE30 = {WS_FWD_METHOD: "warp_specialize", PERSISTENT_FWD_METHOD: "persistent"}
OURS = ("flashtrain", *GLUON_KINDS, *ISSUE30)


def issue30_variant(flag: str, dry: bool) -> TileConfig:
    """The first fwd variant of tile_sweep.VARIANTS (DRY_RUN_VARIANTS in the dry run) with
    `flag` (warp_specialize or persistent) and not the other: the one-loop warp-specialized
    forward, or the persistent one (block_d follows head_dim at launch)."""
    pool = tile_sweep.DRY_RUN_VARIANTS["fwd"] if dry else tile_sweep.VARIANTS["fwd"]
    other = ({"warp_specialize", "persistent"} - {flag}).pop()
    fields = next(f for f in pool if f.get(flag) and not f.get(other))
    return TileConfig(block_d=0, **fields)


def method_overrides(name: str, dry: bool = False) -> dict[str, TileConfig]:
    """kind -> config in force for one of OURS (empty: today's default)."""
    if name in GLUON_KINDS:
        return ws_route.variant_configs(*GLUON_KINDS[name])
    if name in ISSUE30:
        return {"fwd": issue30_variant(ISSUE30[name], dry)}
    return {}


def methods(q, k, v, *, causal: bool, names) -> dict:
    """name -> (forward, inputs) or why it cannot run here (baselines.dense_methods); each of
    OURS is flashtrain's closure, run under its configs (method_overrides) by method_rows.
    q, k, v: (B, S, H, D) leaves that require grad."""
    built = baselines.dense_methods(q, k, v, causal=causal,
                                    names=tuple(n for n in names if n not in OURS))  # fmt: skip
    for name in OURS:
        built[name] = built["flashtrain"]
    return {name: built[name] for name in names}


def _labels(overrides: dict[str, TileConfig]) -> dict[str, str]:
    return {kind: tile_sweep.config_label(asdict(cfg)) for kind, cfg in overrides.items()}


def method_rows(name: str, method, dims, causal: bool, rep: int, device, *, require_gluon: bool,
                dry: bool = False) -> list[dict]:  # fmt: skip
    """The fwd, fwd_bwd and bwd rows of one method (bench_method). Ours carry which kernels ran
    (ws_route.route_fields: kernel and route those of its Gluon kernels, or the backward's) and
    configs (the configs in force, labelled); where require_gluon, a Gluon method the route declines
    raises, so a fallback is never timed as a Gluon kernel. An error in ours raises; a
    baseline's is a note."""
    if isinstance(method, str):  # a baseline that cannot run here: a finished row
        return skipped_rows(name, method, dims, causal)
    forward, inputs = method
    if name not in OURS:
        return bench_method(name, forward, inputs, dims, causal, rep, device=device)
    overrides = method_overrides(name, dry)
    with ws_route.overridden(overrides):
        routes = ws_route.routes(*inputs, causal=causal)
        for kind in ws_route.gluon_kinds(overrides):
            kernel, reason = routes[kind]
            if require_gluon and kernel != ws_route.GLUON:
                what = ws_route.KERNELS[kind][0]
                raise RuntimeError(f"the route declined the Gluon {what}: {reason}")
        rows = bench_method(name, forward, inputs, dims, causal, rep, device=device,
                            baseline=False)  # fmt: skip
    fields = ws_route.route_fields(routes, ws_route.gluon_kinds(overrides))
    return [dict(r, **fields, configs=_labels(overrides)) for r in rows]


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


def forward_candidates(head_dim: int, dry: bool) -> list[TileConfig]:
    """The fwd configs the section judges at head_dim: the Gluon forward at each ring depth
    route.FWD_STAGES allows there (the dry run's toy head dims stand in for 128 and 64), then
    issue 30's warp-specialized one-loop and persistent forwards."""
    stand_in = {32: 128, 16: 64} if dry else {}
    depths = route.FWD_STAGES.get(stand_in.get(head_dim, head_dim), ())
    gluon = [ws_route.forward_variant_config(stages) for stages in depths]
    variants = [issue30_variant(flag, dry) for flag in ISSUE30.values()]
    block_d = tuning.block_d_for(head_dim)
    return [replace(cfg, block_d=block_d) for cfg in (*gluon, *variants)]


def _forward_candidate(cfg: TileConfig, key: str, q, k, v, rep, device, *,
                       require_gluon: bool) -> dict:  # fmt: skip
    """One fwd candidate's verdict (compare_to_builtin); a Gluon one the route declines is not
    timed (where require_gluon, it raises)."""
    label = tile_sweep.config_label(asdict(cfg))
    row = {"key": key, "config": asdict(cfg), "candidate": label, "winner": False, "route": None}
    with tuning.overridden("fwd", cfg):
        declined = ws_route.sweep_declines("fwd", q, k, v)
    if declined and require_gluon:
        raise RuntimeError(f"the route declined the Gluon forward: {declined}")
    if declined:
        return dict(row, route=declined,
                    note=f"{label}: not timed: the route declines it ({declined})")  # fmt: skip
    verdict = tile_sweep.compare_to_builtin("fwd", cfg, q, k, v, rep, device)
    why = ("" if verdict["faster"] else "slower than the built-in config" if verdict["agrees"]
           else f"differs from the built-in config (> {tile_sweep.AGREEMENT}): not timed")  # fmt: skip
    return dict(row, **verdict, note=f"{label}: {why}" if why else label)


def forward_table_check(head_dim: int, dtype, *, seqlen: int, tokens: int, rep: int, device,
                        require_gluon: bool, verified: bool, dry: bool = False) -> list[dict]:  # fmt: skip
    """Every fwd candidate (forward_candidates) for key fwd/<head_dim>/<dtype>, judged as
    table_check judges the Gluon backward: a row each, "winner" on at most one, the fastest that
    agrees with and beats the built-in config (a Gluon one only if `verified`: every correctness
    check of the section passed)."""
    q, k, v = tile_sweep.sweep_inputs(head_dim, dtype, seqlen, tokens, device)
    key = tuning.table_key("fwd", head_dim, dtype)
    rows = [_forward_candidate(cfg, key, q, k, v, rep, device, require_gluon=require_gluon)
            for cfg in forward_candidates(head_dim, dry)]  # fmt: skip
    faster = [r for r in rows if r.get("faster")]
    held = lambda r: r["config"]["gluon"] and not verified  # noqa: E731
    eligible = sorted((r for r in faster if not held(r)), key=lambda r: r["ms"])
    for r in faster:
        if held(r):
            r["note"] += "; not written: a correctness check of this section did not pass"
        elif r is not eligible[0]:
            r["note"] += "; not written: a faster candidate won"
    if eligible:
        eligible[0]["winner"] = True
    return rows


def write_winners(path, device_name: str, rows: list[dict]) -> dict | None:
    """The winners of `rows` (table_check, forward_table_check) merged into the per-GPU table at
    `path` (its other entries kept: the sweep writes the same file); the table written, or None
    if no winner."""
    winners = {r["key"]: tuning.TileConfig(**r["config"]) for r in rows if r.get("winner")}
    if not winners:
        return None
    table = tile_sweep.merged_table(path, device_name, winners)
    results.write_json(path, table)
    return table
