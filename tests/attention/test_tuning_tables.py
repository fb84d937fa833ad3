"""kernels/tuning.py's per-GPU tables and the sweep's override: which config a launch gets."""

from __future__ import annotations

import json

import pytest
import torch

from flashtrain.kernels import tuning
from flashtrain.kernels.tuning import TileConfig

pytestmark = [
    pytest.mark.single_route,  # kernel internals: run once, not once per CPU route
    pytest.mark.config_choice,  # which config a launch gets: the variant pass forces one
]


def test_override_wins_inside_the_block_only():
    cpu = torch.device("cpu")
    builtin = tuning.forward_config(100, torch.float16, cpu)
    with tuning.overridden("fwd", TileConfig(64, 32, 16, 8, 3)):
        cfg = tuning.forward_config(100, torch.float16, cpu)
        assert cfg == TileConfig(64, 32, 128, 8, 3)  # block_d follows head_dim
        assert tuning.forward_config(100, torch.float16, cpu, sparse_block=64).block_m == 64
        assert tuning.config("dkdv", 100, torch.float16, cpu) != cfg  # fwd only
        assert tuning.config("dq", 100, torch.float16, cpu) != cfg
    assert tuning.forward_config(100, torch.float16, cpu) == builtin


def test_table_is_read_for_its_gpu(tmp_path, monkeypatch):
    configs = {
        "fwd/128/bfloat16": TileConfig(128, 128, 128, 8, 2),
        "dq/128/bfloat16": TileConfig(64, 64, 128, 4, 2, tma=True),
    }
    payload = tuning.table_payload("NVIDIA Test GPU 80GB", configs)
    (tmp_path / "nvidia-test-gpu-80gb.json").write_text(json.dumps(payload))
    monkeypatch.setattr(tuning, "TABLES", tmp_path)
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (9, 0))  # what a GPU reports
    monkeypatch.setattr(tuning, "max_shared_memory", lambda device: 232448)  # an H100's
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU 80GB")
    tuning._table.cache_clear()
    cuda = torch.device("cuda")
    try:
        assert tuning.forward_config(128, torch.bfloat16, cuda) == TileConfig(128, 128, 128, 8, 2)
        assert tuning.forward_config(120, torch.bfloat16, cuda) == TileConfig(128, 128, 128, 8, 2)
        assert tuning.config("dq", 128, torch.bfloat16, cuda) == TileConfig(64, 64, 128, 4, 2, True)
        # keys the table lacks fall back to the built-in rules
        assert tuning.forward_config(64, torch.bfloat16, cuda) == tuning._forward_rule(
            64, torch.bfloat16, cuda
        )
        assert tuning.config("dkdv", 128, torch.bfloat16, cuda) == tuning._dkdv_rule(
            128, torch.bfloat16, cuda
        )
    finally:
        tuning._table.cache_clear()


@pytest.mark.parametrize(("name", "slug"), [("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3")])
def test_gpu_slug(name, slug):
    assert tuning.gpu_slug(name) == slug


def _stand_in_gpu(monkeypatch, capability):
    """A compile target's capability on CPU tensors: tables read the shared-memory size from it."""
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: capability)


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (9, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_builtin_config_fits_shared_memory(monkeypatch, capability, dtype, head_dim):
    _stand_in_gpu(monkeypatch, capability)
    limit = tuning.max_shared_memory(torch.device("cpu"))
    for kind in tuning.KINDS:
        cfg = tuning.config(kind, head_dim, dtype, torch.device("cpu"))
        assert tuning.shared_bytes(kind, cfg, dtype.itemsize) <= limit, (kind, cfg)
        assert cfg.block_d == tuning.block_d_for(head_dim)


def test_fp32_hd256_steps_down_where_hopper_does_not(monkeypatch):
    """The built-in fp32 hd256 forward (64 x 32, 2 stages: 192 KiB) fits an H100's 227 KiB and is
    trimmed on an A100 (163 KiB): one stage fewer first, the smallest loss of speed."""
    cpu = torch.device("cpu")
    _stand_in_gpu(monkeypatch, (9, 0))
    hopper = tuning.config("fwd", 256, torch.float32, cpu)
    _stand_in_gpu(monkeypatch, (8, 0))
    ampere = tuning.config("fwd", 256, torch.float32, cpu)
    assert tuning.shared_bytes("fwd", hopper, 4) == 196608 <= 232448
    assert ampere == TileConfig(64, 32, 256, 8, 1)


def test_step_down_order():
    cfg = TileConfig(128, 64, 128, 8, 3)
    assert tuning.step_down("fwd", cfg) == TileConfig(128, 64, 128, 8, 2)
    one = TileConfig(128, 64, 128, 8, 1)
    assert tuning.step_down("fwd", one) == TileConfig(128, 32, 128, 8, 1)  # keys streamed
    assert tuning.step_down("dkdv", one) == TileConfig(64, 64, 128, 8, 1)  # queries streamed
    assert tuning.step_down("dq", TileConfig(64, 16, 64, 4, 1)) == TileConfig(32, 16, 64, 4, 1)
    assert tuning.step_down("fwd", TileConfig(16, 16, 64, 4, 1)) is None


def test_launch_that_runs_out_of_resources_steps_down_and_remembers():
    """Triton raises OutOfResources when a compiled kernel needs more shared memory than the GPU
    has, before anything runs; the launch retries smaller and later launches start there."""
    from triton.runtime.errors import OutOfResources

    tried = []

    def launch(cfg):
        tried.append(cfg)
        if cfg.num_stages > 1:
            raise OutOfResources(300000, 232448, "shared memory")

    cfg = TileConfig(128, 128, 128, 8, 3, tma=True)
    with pytest.warns(UserWarning, match="does not fit"):
        tuning.launch_fitted("fwd", cfg, launch)
    assert [c.num_stages for c in tried] == [3, 2, 1]
    tried.clear()
    tuning.launch_fitted("fwd", cfg, launch)
    assert tried == [TileConfig(128, 128, 128, 8, 1, tma=True)]
    tuning._STEPPED.clear()


def test_tma_flag(monkeypatch):
    cpu = torch.device("cpu")
    assert not tuning.config("fwd", 64, torch.float16, cpu).tma  # built-in: pointer loads
    monkeypatch.setenv(tuning.TMA_ENV, "1")
    assert tuning.config("fwd", 64, torch.float16, cpu).tma
    with tuning.forced_tma(False):
        assert not tuning.config("dq", 64, torch.float16, cpu).tma
    monkeypatch.setenv(tuning.TMA_ENV, "yes")
    with pytest.raises(ValueError, match="FLASHTRAIN_TMA"):
        tuning.config("fwd", 64, torch.float16, cpu)
