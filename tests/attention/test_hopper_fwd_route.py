"""Which forward a call takes (kernels/hopper/route.py): the Gluon forward only where the fwd
config asks for it and the call is one it covers, each other call on the Triton forward with
the built-in tiles, and a one-line reason for every call it declines."""

import pytest
import torch

from flashtrain.kernels import tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.flash_fwd import flash_forward
from flashtrain.kernels.hopper.route import (
    FWD_STAGES,
    forward_config_blocker,
    ws_forward_blocker,
    ws_forward_config,
)

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

GLUON = ws_forward_config()  # 128 x 128, one warpgroup a consumer, 2 stages, gluon


def _call(dtype=torch.bfloat16, head_dim=128, heads_q=4, heads_kv=2, **options):
    """The blocker's arguments for a (2, 200, H, D) call, as flash_forward passes them."""
    q = torch.empty(2, 200, heads_q, head_dim, dtype=dtype)
    k = torch.empty(2, 200, heads_kv, head_dim, dtype=dtype)
    call = dict(q4=q, k4=k, v4=torch.empty_like(k), o4=torch.empty_like(q), dropout_p=0.0,
                softcap=0.0, alibi_slopes=None, window_left=UNBOUNDED, window_right=0,
                sparse=False)  # fmt: skip
    call.update(options)
    return call


def test_a_covered_call_takes_the_gluon_forward(hopper):
    assert ws_forward_blocker(GLUON, **_call()) is None  # bf16 d128 causal GQA
    assert ws_forward_blocker(GLUON, **_call(torch.float16, 64, window_right=UNBOUNDED)) is None
    assert ws_forward_blocker(ws_forward_config(3), **_call(head_dim=64)) is None
    packed = torch.empty(1, 333, 4, 64, dtype=torch.bfloat16)  # a varlen call's view
    kv = torch.empty(1, 333, 2, 64, dtype=torch.bfloat16)
    assert ws_forward_blocker(GLUON, **_call(q4=packed, k4=kv, v4=kv, o4=packed)) is None


@pytest.mark.parametrize(
    "options, reason",
    [
        (dict(dtype=torch.float32), "dtype torch.float32"),
        (dict(head_dim=96), "head_dim 96"),
        (dict(dropout_p=0.1), "dropout"),
        (dict(softcap=30.0), "soft-capping"),
        (dict(alibi_slopes=torch.ones(2, 4)), "ALiBi"),
        (dict(window_left=64), "a sliding window"),
        (dict(window_right=3), "a sliding window"),
        (dict(sparse=True), "a block mask"),
    ],
)
def test_uncovered_calls_say_why(hopper, options, reason):
    found = ws_forward_blocker(GLUON, **_call(**options))
    assert found is not None and found.startswith(reason) and found.endswith("is not covered")


def test_tensors_one_descriptor_cannot_read_as_rows_are_declined(hopper):
    """Its descriptors read a batch as one (rows, H * D) matrix: heads apart, or sequences
    apart (a batch sliced out of a longer buffer), are refused, as is a misaligned base."""
    head_major = torch.empty(2, 4, 200, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert "descriptors" in ws_forward_blocker(GLUON, **_call(q4=head_major))
    gapped = torch.empty(2, 256, 4, 128, dtype=torch.bfloat16)[:, :200]  # 56 rows between
    assert "sequences adjacent" in ws_forward_blocker(GLUON, **_call(o4=gapped))
    shifted = torch.empty(2 * 200 * 4 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 200, 4, 128)
    assert "descriptors" in ws_forward_blocker(GLUON, **_call(q4=shifted))


def test_the_gpu_the_interpreter_and_the_config_decide_first(monkeypatch):
    monkeypatch.setattr(tuning, "interpreted", lambda: True)
    assert "interpreter" in ws_forward_blocker(GLUON, **_call())
    monkeypatch.setattr(tuning, "interpreted", lambda: False)
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (8, 0))
    assert "Hopper" in ws_forward_blocker(GLUON, **_call())
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (9, 0))
    assert "does not ask" in ws_forward_blocker(tuning.TileConfig(128, 128, 128, 8, 3), **_call())
    monkeypatch.setenv(tuning.TMA_ENV, "0")
    with tuning.overridden("fwd", GLUON):
        cfg = tuning.config("fwd", 128, torch.bfloat16, torch.device("cpu"))
    assert not cfg.tma and "FLASHTRAIN_TMA=0" in ws_forward_blocker(cfg, **_call())


def test_only_the_compiled_tiles_are_allowed():
    for head_dim, depths in FWD_STAGES.items():
        for stages in depths:
            assert forward_config_blocker(ws_forward_config(stages), head_dim) is None
    assert "num_stages=3" in forward_config_blocker(ws_forward_config(3), 128)  # > 227 KiB
    assert "block_m=128" in forward_config_blocker(
        tuning.TileConfig(64, 128, 0, 4, 2, tma=True, gluon=True), 64)  # fmt: skip


def test_the_shared_memory_model_fits_every_allowed_tile():
    """tuning.ws_forward_shared_bytes (what fit_shared_memory uses) stays under sm_90's opt-in
    limit for every allowed tile, so a table entry is never stepped down to a tile the route
    then refuses; the cubins' figures are checked in test_hopper_fwd_compile.py."""
    for head_dim, depths in FWD_STAGES.items():
        for stages in depths:
            cfg = tuning.TileConfig(**{**ws_forward_config(stages).__dict__, "block_d": head_dim})
            assert tuning.shared_bytes("fwd", cfg, 2) <= 232_448
    # and a third d128 slot does not (beside the Q buffers and the output staging tile): why
    # FWD_STAGES[128] stops at 2
    third = tuning.TileConfig(**{**ws_forward_config(3).__dict__, "block_d": 128})
    assert max(FWD_STAGES[128]) == 2 and tuning.shared_bytes("fwd", third, 2) > 232_448


def _qkv(seed):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, h: torch.randn(2, s, h, 64, generator=gen).to(torch.float16)  # noqa: E731
    return make(70, 4), make(90, 2), make(90, 2)


@pytest.mark.parametrize("causal", [True, False])
def test_a_declined_call_runs_the_built_in_triton_forward(causal):
    """Under the interpreter the route declines the Gluon kernel: the call gets the built-in
    forward tiles, so its output and lse are bitwise those of a run with no config asked."""
    q, k, v = _qkv(5)
    args = dict(cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=70, max_seqlen_k=90,
                softmax_scale=0.125, window_left=UNBOUNDED,
                window_right=0 if causal else UNBOUNDED, dropout_p=0.0, seed=0)  # fmt: skip

    def run():
        out, lse = torch.empty_like(q), torch.empty(2, 4, 70)
        flash_forward(q, k, v, out, lse, **args)
        return out, lse

    expected = run()
    with tuning.overridden("fwd", GLUON):
        got = run()
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
