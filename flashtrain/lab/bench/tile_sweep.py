"""The tile-config sweep of the GPU suite: time candidate configs of each kernel kind of
kernels/tuning.py against the built-in rules, keep the fastest per (kind, head_dim, dtype), and
return them as a per-GPU table (kernels/tuning_tables/<gpu-slug>.json). A config is timed only
once its output and gradients (causal and full) agree with the built-in config's within
AGREEMENT: a new kernel form (the Hopper variants) may run on a GPU first in its sweep.

Kinds are timed where they run: fwd on the forward; dkdv on forward + backward with the default
deterministic=False (its atomic-dQ pass); dq on forward + backward with deterministic=True, with
dkdv's winner in place. Each kind's pointer-load candidates go first; the two fastest are then
timed again with tensor-descriptor (TMA) loads, where the GPU and Triton have them.

The table file may hold entries another writer measured (the GPU suite's hopper section writes
the Gluon backward's): merged_table keeps them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from flashtrain.attention import flash_attn_func
from flashtrain.kernels import tma, tuning
from flashtrain.kernels.hopper import route as hopper_route
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab.bench import baselines, measure, ws_route
from flashtrain.lab.bench.attention_rows import random_qkv

# (block_m, block_n, num_warps, num_stages). Configs that do not fit a GPU's shared memory are
# trimmed by tuning.fit_shared_memory (recorded as the config actually timed); one that fails
# to launch is recorded as failed and never chosen.
CANDIDATES = {
    # fwd: block_m queries held, block_n keys streamed
    "fwd": [
        (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 2), (128, 64, 4, 3),
        (128, 64, 8, 3), (128, 64, 4, 4), (128, 64, 8, 2), (64, 64, 4, 3),
    ],
    # dkdv: block_n keys held, block_m queries streamed
    "dkdv": [
        (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2),
        (64, 128, 8, 1), (128, 128, 8, 2), (64, 128, 4, 2),
    ],
    # dq: block_m queries held, block_n keys streamed
    "dq": [
        (128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (128, 64, 4, 3),
        (64, 32, 4, 2), (128, 128, 8, 2),
    ],
}  # fmt: skip
TMA_RETRIES = 2  # the fastest pointer configs timed again with descriptor loads

# The Hopper variants (issue 30; docs/kernel_compile.md "Variants"), timed after the candidates
# wherever descriptor loads are allowed (they load through descriptors): the warp-specialized
# forward (4 warps: Triton ignores the flag at 8), the persistent one, both; dK/dV with 64-row
# query tiles on descriptors (its pointer form is a candidate above), and the Gluon kernels
# (the forward, issue 46; the backward, issue 43) at each tile kernels/hopper/route.py allows,
# only at the head dims it allows them ("head_dims"). The warp-specialized forward's time includes the copy of V it
# needs (docs/attention_semantics.md).
_WS = dict(tma=True, warp_specialize=True)
_GLUON = dict(tma=True, gluon=True)
_PERSISTENT = dict(tma=True, persistent=True)


def _gluon_backward_variants() -> list[dict]:
    """route.TILES as variant fields: one entry per (block_m, stages), with its head dims."""
    dims_of: dict[tuple[int, int], list[int]] = {}
    for head_dim, tiles in hopper_route.TILES.items():
        for tile in tiles:
            dims_of.setdefault(tile, []).append(head_dim)
    return [
        dict(block_m=m, block_n=hopper_route.BLOCK_N, num_warps=hopper_route.NUM_WARPS,
             num_stages=stages, **_GLUON, head_dims=tuple(dims))
        for (m, stages), dims in dims_of.items()
    ]  # fmt: skip


def _gluon_forward_variants() -> list[dict]:
    """route.FWD_STAGES as variant fields: one entry per ring depth, with its head dims."""
    dims_of: dict[int, list[int]] = {}
    for head_dim, depths in hopper_route.FWD_STAGES.items():
        for stages in depths:
            dims_of.setdefault(stages, []).append(head_dim)
    return [
        dict(block_m=hopper_route.FWD_BLOCK_M, block_n=hopper_route.BLOCK_N,
             num_warps=hopper_route.FWD_NUM_WARPS, num_stages=stages, **_GLUON,
             head_dims=tuple(dims))
        for stages, dims in dims_of.items()
    ]  # fmt: skip


VARIANTS = {
    "fwd": [
        dict(block_m=128, block_n=128, num_warps=4, num_stages=2, **_WS),
        dict(block_m=128, block_n=128, num_warps=4, num_stages=3, **_WS),
        dict(block_m=128, block_n=64, num_warps=4, num_stages=3, **_WS),
        dict(block_m=128, block_n=128, num_warps=8, num_stages=2, **_PERSISTENT),
        dict(block_m=128, block_n=128, num_warps=8, num_stages=3, **_PERSISTENT),
        dict(block_m=128, block_n=128, num_warps=4, num_stages=2, **_WS, persistent=True),
        *_gluon_forward_variants(),
    ],
    "dkdv": [
        dict(block_m=64, block_n=128, num_warps=8, num_stages=2, tma=True),
        *_gluon_backward_variants(),
    ],
}
# the GPU suite's dry run (CPU, interpreter): the same variants at the interpreter's tiles
DRY_RUN_VARIANTS = {
    "fwd": [
        dict(block_m=32, block_n=16, num_warps=4, num_stages=1, **_WS),
        dict(block_m=32, block_n=16, num_warps=4, num_stages=1, **_PERSISTENT),
        dict(block_m=32, block_n=16, num_warps=4, num_stages=1, **_WS, persistent=True),
    ],
}


def config_label(cfg: dict) -> str:
    """ "128x128 w4 s2 tma ws persistent", "64x128 w8 s2 tma gluon": a config's tiles, warps,
    stages and variant flags."""
    flags = [name for name, key in (("tma", "tma"), ("ws", "warp_specialize"),
                                    ("persistent", "persistent"), ("gluon", "gluon"))
             if cfg.get(key)]  # fmt: skip
    return " ".join([f"{cfg['block_m']}x{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']}",
                     *flags])  # fmt: skip


def _run_of(kind: str, q, k, v, causal: bool) -> Callable[[], object]:
    """What a kind is timed on: the forward (fwd) or forward + backward (dkdv with the atomic-dQ
    backward, dq with the deterministic one)."""
    fwd = lambda: flash_attn_func(q, k, v, causal=causal, deterministic=kind == "dq")  # noqa: E731
    return fwd if kind == "fwd" else baselines.with_backward(fwd, (q, k, v))


def _timed(kind: str, q, k, v, rep: int, device) -> float | None:
    """Summed median ms over causal and not of _run_of(kind)."""
    total = 0.0
    for causal in (False, True):
        fn = _run_of(kind, q, k, v, causal)
        try:
            m = measure.measure(fn, rep=rep, device=device, baseline=False)
        except Exception as err:  # noqa: BLE001  (triton's OutOfResources is no RuntimeError)
            if measure.is_cuda_fault(err):  # the context is dead: no later config can run
                raise
            return _failed(err)
        if m.ms is None:
            return None
        total += m.ms
    return total


# largest |difference| from the built-in config's results a config may show, relative to each
# result's largest magnitude (bf16 keeps 8 bits: a few roundings apart is ~1e-2; a wrong tile
# or a NaN is far off)
AGREEMENT = 5e-2


def _results(q, k, v) -> list[torch.Tensor]:
    """Output and gradients of causal and full attention under the configs in force: what a
    config must reproduce before its time counts."""
    found = []
    for causal in (False, True):
        out = flash_attn_func(q, k, v, causal=causal)
        grad_out = torch.randn(out.shape, generator=torch.Generator(out.device).manual_seed(0),
                               device=out.device, dtype=out.dtype)  # fmt: skip
        found += [out, *torch.autograd.grad(out, (q, k, v), grad_out)]
    return found


def _disagreement(reference: list[torch.Tensor], q, k, v) -> float:
    """Largest |difference| between the configs in force and `reference` (_results), relative
    to each reference result's largest magnitude; NaN where a result is not finite."""
    worst = 0.0
    for got, want in zip(_results(q, k, v), reference):
        got, want = got.detach(), want.detach()  # the forward's output is part of a graph
        scale = max(float(want.float().abs().max()), 1e-6)
        off = float((got.float() - want.float()).abs().max()) / scale
        worst = off if off != off or off > worst else worst  # NaN sticks
    return worst


def _failed(err: Exception) -> None:
    print(f"  config failed: {type(err).__name__}: {str(err).splitlines()[0][:100]}", flush=True)


def _sweep_kind(kind, key, q, k, v, pool, variants, rep, device, hooks: Hooks) -> TileConfig | None:
    """Time the built-in config, every candidate of one kind (pool), the fastest again with
    descriptor loads, then the variants; the winner, if it beats the built-in one."""
    builtin = _timed(kind, q, k, v, rep, device)
    reference = _results(q, k, v)
    timed: list[tuple[float, TileConfig]] = []

    def time_one(cfg: TileConfig) -> None:
        reason = hooks.why_not()
        if reason:
            hooks.row({"key": key, "config": cfg.__dict__, "note": f"skipped: {reason}"})
            return
        with tuning.overridden(kind, cfg):
            declined = ws_route.sweep_declines(kind, q, k, v)
        if declined:  # its launches would run the built-in config: nothing of it to time
            hooks.row({"key": key, "config": cfg.__dict__, "ms": None, "builtin_ms": builtin,
                       "note": f"not timed: the route declines it ({declined})"})  # fmt: skip
            print(f"  {key} {config_label(cfg.__dict__)}: not timed: the route declines it "
                  f"({declined})", flush=True)  # fmt: skip
            return
        with tuning.overridden(kind, cfg):
            try:  # a config that computes something else is never timed, let alone chosen
                off = _disagreement(reference, q, k, v)
            except Exception as err:  # noqa: BLE001  (as in _timed)
                if measure.is_cuda_fault(err):
                    raise
                off = _failed(err)
            agrees = off is not None and off <= AGREEMENT  # False for NaN too
            ms = _timed(kind, q, k, v, rep, device) if agrees else None
        if off is not None and not agrees:
            print(f"  {key} {config_label(cfg.__dict__)}: differs from the built-in config by "
                  f"{off:.3g} (> {AGREEMENT}): not timed", flush=True)  # fmt: skip
        ratio = builtin / ms if ms and builtin else None
        hooks.row({"key": key, "config": cfg.__dict__, "ms": ms, "builtin_ms": builtin,
                   "speedup_vs_builtin": ratio, "max_diff_vs_builtin": off})  # fmt: skip
        print(f"  {key} {config_label(cfg.__dict__)}: {ms} ms (built-in {builtin})", flush=True)
        if ms is not None:
            timed.append((ms, cfg))

    for cfg in pool:
        time_one(cfg)
    descriptors = hooks.tma_ok and tma.available(torch.device(device))
    if descriptors:
        fastest = [cfg for _, cfg in sorted(timed, key=lambda t: t[0])[:TMA_RETRIES]]
        for cfg in fastest:
            time_one(replace(cfg, tma=True))
    for cfg in variants:
        if descriptors or not cfg.tma:
            time_one(cfg)
        else:  # not planned here: the sweep is complete without it
            print(f"  {key} {config_label(cfg.__dict__)}: not timed (descriptor loads are not "
                  "allowed here)", flush=True)  # fmt: skip
    if not timed:
        return None
    best_ms, best = min(timed, key=lambda t: t[0])
    return best if builtin is None or best_ms < builtin else None


@dataclass
class Hooks:
    """How the caller follows and stops a sweep: why_not() -> a reason to time no further
    config (or None); row(r) after every config, winners(w) after every kind (so the caller can
    write both as they come); tma_ok: descriptor-load retries allowed (their correctness passed)."""

    why_not: Callable[[], str | None] = lambda: None
    row: Callable[[dict], None] = lambda r: None
    winners: Callable[[dict[str, TileConfig]], None] = lambda w: None
    tma_ok: bool = True


def sweep_inputs(head_dim: int, dtype, seqlen: int, tokens: int, device):
    """q, k, v of one head dim: `tokens` per batch, 2048 // head_dim heads."""
    heads = max(1, 2048 // head_dim)
    batch = max(1, tokens // seqlen)
    return random_qkv(batch, seqlen, heads, head_dim, device=device, dtype=dtype)


def builtin_launches(*, head_dims, dtype, seqlen, tokens, device,
                     kinds=tuning.KINDS) -> dict[str, Callable]:  # fmt: skip
    """what -> a first launch of each run sweep() times with the built-in configs (the GPU
    suite's compile phase), for `kinds`. The candidates compile at their first, untimed, call
    instead: tuning.overridden is process-wide, so two of them cannot be launched side by side
    (called inside an override, the launches run the config in force)."""

    def launch(kind: str, head_dim: int, causal: bool) -> None:
        _run_of(kind, *sweep_inputs(head_dim, dtype, seqlen, tokens, device), causal)()

    launches = {}
    for head_dim, kind, causal in itertools.product(head_dims, kinds, (False, True)):
        key, mode = tuning.table_key(kind, head_dim, dtype), "causal" if causal else "full"
        launches[f"{key} built-in {mode}"] = functools.partial(launch, kind, head_dim, causal)
    return launches


def sweep(
    *, head_dims, dtype, seqlen, tokens, rep, device, hooks: Hooks, candidates=None, variants=None
) -> dict[str, TileConfig]:
    """Winning configs by table key; every timed (key, config) goes to hooks.row with its ratio
    to the built-in config. candidates: {kind: [(block_m, block_n, warps, stages), ...]} in
    place of CANDIDATES; variants: {kind: [TileConfig fields but block_d, ...]} in place of
    VARIANTS."""
    winners: dict[str, TileConfig] = {}
    pools = candidates or CANDIDATES
    variant_pools = VARIANTS if variants is None else variants
    for head_dim in head_dims:
        q, k, v = sweep_inputs(head_dim, dtype, seqlen, tokens, device)
        block_d = tuning.block_d_for(head_dim)
        limit = tuning.max_shared_memory(torch.device(device))
        for kind in tuning.KINDS:
            key = tuning.table_key(kind, head_dim, dtype)
            pool = []
            for m, n, warps, stages in pools.get(kind, ()):
                cfg = TileConfig(m, n, block_d, warps, stages)
                cfg = tuning.fit_shared_memory(kind, cfg, dtype.itemsize, limit)
                if cfg not in pool:
                    pool.append(cfg)
            fitted = [
                tuning.fit_shared_memory(kind, TileConfig(block_d=block_d, **fields),
                                         dtype.itemsize, limit)
                for fields in _at_head_dim(variant_pools.get(kind, ()), head_dim)
            ]  # fmt: skip
            # dq is timed with dkdv's winner in place (the backward it runs in)
            dkdv_winner = winners.get(tuning.table_key("dkdv", head_dim, dtype))
            in_place = (
                tuning.overridden("dkdv", dkdv_winner)
                if kind == "dq" and dkdv_winner
                else contextlib.nullcontext()
            )
            with in_place:
                best = _sweep_kind(kind, key, q, k, v, pool, fitted, rep, device, hooks)
            if best is not None:
                winners[key] = best
            hooks.winners(winners)
    return winners


def _at_head_dim(variants, head_dim: int) -> list[dict]:
    """The variants' TileConfig fields that apply at head_dim (all but those whose "head_dims"
    leave it out)."""
    return [
        {k: v for k, v in fields.items() if k != "head_dims"}
        for fields in variants
        if head_dim in fields.get("head_dims", (head_dim,))
    ]


def compare_to_builtin(kind: str, cfg: TileConfig, q, k, v, rep: int, device) -> dict:
    """One config judged as the sweep judges it: the built-in config's time and results first,
    then cfg's disagreement with them, and only if it agrees (within AGREEMENT) its time.
    An error computing the results raises (the caller's measurement fails); one while timing
    leaves that time None, as in the sweep. faster: it agrees and beats the built-in config."""
    builtin = _timed(kind, q, k, v, rep, device)
    reference = _results(q, k, v)
    with tuning.overridden(kind, cfg):
        off = _disagreement(reference, q, k, v)
        agrees = off <= AGREEMENT  # False for NaN too
        ms = _timed(kind, q, k, v, rep, device) if agrees else None
    faster = bool(ms and builtin and ms < builtin)
    return {"ms": ms, "builtin_ms": builtin, "speedup_vs_builtin": builtin / ms if ms and builtin
            else None, "max_diff_vs_builtin": off, "agrees": agrees, "faster": faster}  # fmt: skip


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"


def table_file(name: str) -> str:
    """The per-GPU table's file name in the suite's output folder, for a device name."""
    return f"tuning-table-{tuning.gpu_slug(name)}.json"


def merged_table(path: Path, name: str, configs: dict[str, TileConfig]) -> dict:
    """The per-GPU table at `path` (tuning.table_payload's form; none yet: empty) with `configs`
    written over its entries of the same keys; the others stay (another writer measured them:
    every entry was measured faster than the built-in config by whoever wrote it)."""
    found = json.loads(path.read_text())["configs"] if path.is_file() else {}
    kept = {key: TileConfig(**entry) for key, entry in found.items()}
    return tuning.table_payload(name, {**kept, **configs})
