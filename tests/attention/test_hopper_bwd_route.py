"""Which backward a call takes (kernels/hopper/route.py): the warp-specialized Gluon kernel only
where a config asks for it and the call is one it covers, each other call on the Triton kernels
with the built-in tiles, and a one-line reason for every call it declines."""

import pytest
import torch
from kernel_testing import run_kernels

from flashtrain.kernels import tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper import gluon_api
from flashtrain.kernels.hopper.route import (
    TILES,
    config_blocker,
    ws_backward_blocker,
    ws_backward_config,
)

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

WS = ws_backward_config()  # block_m 64, 128 keys, 8 warps, 2 stages, gluon


def _call(dtype=torch.bfloat16, head_dim=128, heads_q=4, heads_kv=2, **options):
    """The blocker's arguments for a (2, 200, H, D) call, as flash_backward passes them."""
    q = torch.empty(2, 200, heads_q, head_dim, dtype=dtype)
    k = torch.empty(2, 200, heads_kv, head_dim, dtype=dtype)
    call = dict(q4=q, k4=k, v4=torch.empty_like(k), do4=torch.empty_like(q),
                dk4=torch.empty_like(k), dv4=torch.empty_like(k),
                lse=torch.empty(2, heads_q, 200), dropout_p=0.0, softcap=0.0, alibi_slopes=None,
                window_left=UNBOUNDED, window_right=0, sparse=False, deterministic=False)  # fmt: skip
    call.update(options)
    return call


def test_a_covered_call_takes_the_gluon_backward(hopper):
    assert ws_backward_blocker(WS, **_call()) is None  # bf16 d128 causal GQA
    assert ws_backward_blocker(WS, **_call(torch.float16, 64, window_right=UNBOUNDED)) is None
    assert ws_backward_blocker(ws_backward_config(stages=3), **_call(head_dim=64)) is None
    # a tile route.TILES leaves out (it spills in the main loop) is declined, saying which are in
    found = ws_backward_blocker(ws_backward_config(128), **_call(head_dim=64))
    assert found and "allowed ((64, 2), (64, 3))" in found


@pytest.mark.parametrize(
    "options, reason",
    [
        (dict(dtype=torch.float32), "dtype torch.float32"),
        (dict(head_dim=72), "head_dim 72"),
        (dict(dropout_p=0.1), "dropout"),
        (dict(softcap=30.0), "soft-capping"),
        (dict(alibi_slopes=torch.ones(2, 4)), "ALiBi"),
        (dict(window_left=64), "a sliding window"),
        (dict(window_right=3), "a sliding window"),
        (dict(sparse=True), "a block mask"),
        (dict(deterministic=True), "deterministic=True"),
    ],
)
def test_uncovered_calls_say_why(hopper, options, reason):
    found = ws_backward_blocker(WS, **_call(**options))
    assert found is not None and found.startswith(reason) and found.endswith("is not covered")


def test_tensors_its_descriptors_cannot_address_are_declined(hopper):
    head_major = torch.empty(2, 4, 200, 128, dtype=torch.bfloat16).transpose(1, 2)  # heads apart
    assert "descriptors" in ws_backward_blocker(WS, **_call(q4=head_major))
    lse = torch.empty(2, 200, 4).transpose(1, 2)
    assert "lse" in ws_backward_blocker(WS, **_call(lse=lse))


def test_the_gpu_and_the_interpreter_decide_first(monkeypatch):
    monkeypatch.setattr(tuning, "interpreted", lambda: True)
    assert "interpreter" in ws_backward_blocker(WS, **_call())
    monkeypatch.setattr(tuning, "interpreted", lambda: False)
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (8, 0))
    assert "Hopper" in ws_backward_blocker(WS, **_call())
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (10, 0))  # no wgmma there
    assert "Hopper" in ws_backward_blocker(WS, **_call())
    default = tuning.TileConfig(32, 128, 128, 8, 2)
    assert "does not ask" in ws_backward_blocker(default, **_call())


def test_descriptor_loads_turned_off_turn_it_off(monkeypatch):
    """FLASHTRAIN_TMA=0 (every launch on pointer loads) leaves the descriptor-only kernel out."""
    monkeypatch.setenv(tuning.TMA_ENV, "0")
    with tuning.overridden("dkdv", WS):
        cfg = tuning.config("dkdv", 128, torch.bfloat16, torch.device("cpu"))
    assert not cfg.tma and "FLASHTRAIN_TMA=0" in ws_backward_blocker(cfg, **_call())


def test_only_the_compiled_tiles_are_allowed():
    for head_dim, tiles in TILES.items():
        for block_m, stages in tiles:
            assert config_blocker(ws_backward_config(block_m, stages), head_dim) is None
    assert "(64, 3)" in config_blocker(ws_backward_config(64, 3), 128)  # 231,788 B, spills
    assert "block_n=128" in config_blocker(tuning.TileConfig(64, 64, 0, 8, 2,
                                                             gluon=True), 64)  # fmt: skip


def test_the_gluon_names_resolve_under_this_triton():
    assert gluon_api.available()
    assert None not in (gluon_api.tma_load, gluon_api.tma_store, gluon_api.partition_barrier)
    assert bool(gluon_api.TMA_REDUCE) == hasattr(gluon_api.tma, "async_atomic_add")


def _qkv(seed):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, h: torch.randn(2, s, h, 64, generator=gen).to(torch.float16)
    return make(70, 4), make(90, 2), make(90, 2), make(70, 4)


def test_a_declined_call_runs_the_built_in_triton_backward():
    """Under the interpreter the route declines the Gluon kernel: the call gets the built-in
    dK/dV tiles, so its results are bitwise those of a run with no config asked."""
    q, k, v, dout = _qkv(3)
    expected = run_kernels(q, k, v, dout, scale=0.125, causal=True, deterministic=False)
    with tuning.overridden("dkdv", WS):
        got = run_kernels(q, k, v, dout, scale=0.125, causal=True, deterministic=False)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
