"""kernels/tuning.py's per-GPU tables and the sweep's override: which config a launch gets."""

from __future__ import annotations

import json

import pytest
import torch

from flashtrain.kernels import tuning
from flashtrain.kernels.tuning import TileConfig


def test_override_wins_inside_the_block_only():
    cpu = torch.device("cpu")
    builtin = tuning.forward_config(100, torch.float16, cpu)
    with tuning.overridden("fwd", TileConfig(64, 32, 16, 8, 3)):
        cfg = tuning.forward_config(100, torch.float16, cpu)
        assert cfg == TileConfig(64, 32, 128, 8, 3)  # block_d follows head_dim
        assert tuning.forward_config(100, torch.float16, cpu, sparse_block=64).block_m == 64
        assert tuning.backward_config(100, torch.float16, cpu) != cfg  # fwd only
    assert tuning.forward_config(100, torch.float16, cpu) == builtin


def test_table_is_read_for_its_gpu(tmp_path, monkeypatch):
    configs = {"fwd/128/bfloat16": TileConfig(128, 128, 128, 8, 2)}
    payload = tuning.table_payload("NVIDIA Test GPU 80GB", configs)
    (tmp_path / "nvidia-test-gpu-80gb.json").write_text(json.dumps(payload))
    monkeypatch.setattr(tuning, "TABLES", tmp_path)
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (9, 0))  # what a GPU reports
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU 80GB")
    tuning._table.cache_clear()
    cuda = torch.device("cuda")
    try:
        assert tuning.forward_config(128, torch.bfloat16, cuda) == TileConfig(128, 128, 128, 8, 2)
        assert tuning.forward_config(120, torch.bfloat16, cuda) == TileConfig(128, 128, 128, 8, 2)
        # keys the table lacks fall back to the built-in rules
        assert tuning.forward_config(64, torch.bfloat16, cuda) == tuning._forward_config(
            64, torch.bfloat16, cuda
        )
    finally:
        tuning._table.cache_clear()


@pytest.mark.parametrize(("name", "slug"), [("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3")])
def test_gpu_slug(name, slug):
    assert tuning.gpu_slug(name) == slug
