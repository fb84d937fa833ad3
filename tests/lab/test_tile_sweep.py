"""The tile sweep (flashtrain/lab/bench/tile_sweep.py) times a config only once it computes what
the built-in config computes: a wrong kernel form can never be chosen for a per-GPU table."""

import torch

from flashtrain.kernels import tuning
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
