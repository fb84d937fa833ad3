"""The tile sweep (flashtrain/lab/bench/tile_sweep.py) times a config only once it computes what
the built-in config computes, and never one whose launches the route gives to another kernel: a
wrong kernel form, or a silent fallback, can never be chosen for a per-GPU table."""

import torch

from flashtrain.kernels import tuning
from flashtrain.kernels.hopper import route as hopper_route
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab.bench import tile_sweep
from flashtrain.lab.bench.attention_rows import random_qkv


def test_a_config_that_disagrees_is_neither_timed_nor_chosen(monkeypatch):
    """The persistent variant is made to double its output (as a wrong kernel would); the
    plain candidate agrees exactly and is timed."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "triton")  # the kernels, interpreted
    attend = tile_sweep.flash_attn_func

    def wrong_when_persistent(q, k, v, **opts):
        out = attend(q, k, v, **opts)
        forced = tuning._OVERRIDES.get("fwd")
        return out * 2 if forced is not None and forced.persistent else out

    monkeypatch.setattr(tile_sweep, "flash_attn_func", wrong_when_persistent)
    small = lambda head_dim, dtype, seqlen, tokens, device: random_qkv(  # noqa: E731
        1, seqlen, 2, head_dim, device=device, dtype=dtype
    )  # 2 heads, not 2048 // head_dim
    monkeypatch.setattr(tile_sweep, "sweep_inputs", small)
    monkeypatch.setattr(tuning, "KINDS", ("fwd",))  # the forward's sweep only
    rows = []
    winners = tile_sweep.sweep(
        head_dims=(16,), dtype=torch.float32, seqlen=20, tokens=20, rep=1, device="cpu",
        hooks=tile_sweep.Hooks(row=rows.append), candidates={"fwd": [(16, 16, 4, 1)]},
        variants={"fwd": [dict(block_m=32, block_n=16, num_warps=4, num_stages=1,
                               persistent=True)]},
    )  # fmt: skip
    timed = {tile_sweep.config_label(r["config"]): r for r in rows}
    wrong, plain = timed["32x16 w4 s1 persistent"], timed["16x16 w4 s1"]
    assert wrong["ms"] is None and wrong["max_diff_vs_builtin"] > 0.5
    assert plain["ms"] is not None and plain["max_diff_vs_builtin"] < 1e-4
    assert not any(config.persistent for config in winners.values())
    assert isinstance(TileConfig(**wrong["config"]), TileConfig)


def test_the_gluon_backward_tiles_are_dkdv_variants_at_their_head_dims():
    """Every (block_m, stages) of kernels/hopper/route.py TILES is a dkdv variant asking for the
    Gluon backward, offered only at the head dims the route allows it."""
    offered = {
        head_dim: {
            (f["block_m"], f["num_stages"])
            for f in tile_sweep._at_head_dim(tile_sweep.VARIANTS["dkdv"], head_dim)
            if f.get("gluon")
        }
        for head_dim in (64, 128, 256)
    }
    assert offered == {
        64: set(hopper_route.TILES[64]),
        128: set(hopper_route.TILES[128]),
        256: set(),
    }
    for fields in tile_sweep._at_head_dim(tile_sweep.VARIANTS["dkdv"], 128):
        config = TileConfig(block_d=128, **fields)  # every variant is a TileConfig's fields
        if config.gluon:
            assert hopper_route.config_blocker(config, 128) is None


def test_the_gluon_forward_depths_are_fwd_variants_at_their_head_dims():
    """Every ring depth of kernels/hopper/route.py FWD_STAGES is a fwd variant asking for the
    Gluon forward, offered only at the head dims the route allows it, each a config the route
    accepts there."""
    offered = {
        head_dim: [f for f in tile_sweep._at_head_dim(tile_sweep.VARIANTS["fwd"], head_dim)
                   if f.get("gluon")]
        for head_dim in (64, 128, 256)
    }  # fmt: skip
    assert {d: {f["num_stages"] for f in fields} for d, fields in offered.items()} == {
        64: set(hopper_route.FWD_STAGES[64]),
        128: set(hopper_route.FWD_STAGES[128]),
        256: set(),
    }
    for head_dim in (64, 128):
        for fields in offered[head_dim]:
            config = TileConfig(block_d=head_dim, **fields)
            assert hopper_route.forward_config_blocker(config, head_dim) is None


def test_a_gluon_config_the_route_declines_is_neither_timed_nor_chosen(monkeypatch):
    """On CPU the route declines the Gluon backward: its launches would run the built-in
    config, agree with it and perhaps win by noise, so the sweep records it untimed."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")  # fast; the route is asked all the same
    small = lambda head_dim, dtype, seqlen, tokens, device: random_qkv(  # noqa: E731
        1, seqlen, 2, head_dim, device=device, dtype=dtype
    )
    monkeypatch.setattr(tile_sweep, "sweep_inputs", small)
    monkeypatch.setattr(tuning, "KINDS", ("dkdv",))
    rows = []
    gluon = dict(block_m=64, block_n=128, num_warps=8, num_stages=2, tma=True,
                 gluon=True, head_dims=(64,))  # fmt: skip
    winners = tile_sweep.sweep(
        head_dims=(64,), dtype=torch.float32, seqlen=20, tokens=20, rep=1, device="cpu",
        hooks=tile_sweep.Hooks(row=rows.append), candidates={"dkdv": []},
        variants={"dkdv": [gluon]},
    )  # fmt: skip
    assert winners == {} and len(rows) == 1
    assert rows[0]["ms"] is None and rows[0]["config"]["gluon"]
    assert rows[0]["note"] == (
        "not timed: the route declines it (Gluon kernels do not run on the Triton interpreter)"
    )
