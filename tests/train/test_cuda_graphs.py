"""trainer.cuda_graphs: refused at start, one line each, where CUDA graph trees cannot work
(flashtrain/train/compile.py check_cuda_graphs); accepted where shapes stay static. On CPU: the
check reads the config and the device's type only."""

from __future__ import annotations

import pytest
import torch
from config_testing import compose

from flashtrain.train.compile import check_cuda_graphs
from flashtrain.train.config import ConfigError, validate_config

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
STATIC = ["data=synthetic", "trainer.cuda_graphs=true"]  # fixed shapes, no document masking


def config(*overrides: str):
    return validate_config(compose([*STATIC, *overrides]))


def refusal(cfg, device=CUDA, **kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        check_cuda_graphs(cfg, device, **kwargs)
    message = str(err.value)
    assert "\n" not in message and message.startswith("trainer.cuda_graphs=true ")
    assert message.endswith("or set trainer.cuda_graphs=false")
    return message


def test_off_by_default_and_never_refused():
    cfg = validate_config(compose(["data=openwebtext", "model.recompute=all"]))
    assert cfg.trainer.cuda_graphs is False
    check_cuda_graphs(cfg, torch.device("cpu"), grad_accum=4)


@pytest.mark.parametrize(
    "overrides",
    [[], ["trainer.compile=true"], ["attention=sdpa"], ["trainer.strategy=ddp"]],
    ids=["compile-auto", "compile-true", "sdpa", "ddp"],
)
def test_static_shapes_on_cuda_pass(overrides):
    check_cuda_graphs(config(*overrides), CUDA)
    check_cuda_graphs(config(*overrides), CUDA, grad_accum=1)


def test_padded_batches_pass_with_sdpa():
    """sdpa keeps a padded batch (B, T) with a mask: the same shape every batch."""
    cfg = config("data=bert_mlm", "model=bert-base", "attention=sdpa")
    check_cuda_graphs(cfg, CUDA)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_refuses_a_device_other_than_cuda(device):
    message = refusal(config(), torch.device(device))
    assert "needs a CUDA device" in message and f"this run is on {device}" in message


def test_refuses_compile_off():
    assert "needs trainer.compile=true" in refusal(config("trainer.compile=false"))


def test_refuses_document_masking():
    message = refusal(config("data=openwebtext"))
    assert "data.document_masking=true" in message and "data.document_masking=false" in message


def test_refuses_flash_on_padded_data():
    message = refusal(config("data=bert_mlm", "model=bert-base"))
    assert "attention=flash on data 'bert_mlm'" in message and "use attention=sdpa" in message


@pytest.mark.parametrize("mode", ["all", "every_k", "offload"])
def test_refuses_recompute(mode):
    message = refusal(config(f"model.recompute={mode}"))
    assert f"model.recompute={mode}" in message and "model.recompute=none" in message


def test_refuses_fsdp():
    message = refusal(config("trainer.strategy=fsdp"))
    assert "trainer.strategy=fsdp" in message and "ddp or single" in message


def test_refuses_gradient_accumulation():
    message = refusal(config(), grad_accum=2)
    assert "over 2 micro-batches" in message and "micro_batch_size" in message


def test_the_trainer_refuses_at_start_with_the_planned_accumulation(tmp_path):
    """Through the trainer: a CPU run is refused before any weight or data exists; a dry run (it
    plans for GPUs) is refused for the accumulation its batch plan needs."""
    from train_testing import TINY

    from flashtrain.train import run

    with pytest.raises(ConfigError, match="needs a CUDA device"):
        run(compose([*TINY, "trainer.cuda_graphs=true"]), tmp_path / "cpu")
    assert not (tmp_path / "cpu").exists()
    dry = [*TINY, "trainer.cuda_graphs=true", "trainer.compile=true", "trainer.max_steps=0"]
    with pytest.raises(ConfigError, match="over 2 micro-batches"):
        run(compose(dry), tmp_path / "dry")  # TINY: micro 4 of 8 sequences
    run(compose([*dry, "micro_batch_size=8"]), tmp_path / "dry")
