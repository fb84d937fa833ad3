"""load_for_inference reads a checkpoint's weights through checkpoint.read_model_state, in either of
the trainer's formats: "torch" (model_optim.pt) and "dcp" (FSDP2's shards, no model_optim.pt;
written here from one process). The loaded model holds exactly the saved weights; at a longer
context GPT-2's learned position table is the saved one tiled (position_mode=copy)."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from flashtrain.inference.checkpoint import load_for_inference
from flashtrain.models import build_model
from flashtrain.train.checkpoint import MODEL_OPTIM
from flashtrain.train.checkpoint_save import save_checkpoint

TINY_GPT2 = dict(arch="gpt2", n_layer=1, n_head=2, d_model=32, vocab_size=23, max_seq_len=16)


def _saved_run(run_dir, *, sharded: bool):
    """A run directory holding one checkpoint (step 3) of a GPT-2 with random weights; returns
    (the model saved, its step folder)."""
    torch.manual_seed(0)
    model = build_model(TINY_GPT2, "sdpa")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_()  # off their init: a model built afresh cannot pass for them
    config = {"model": TINY_GPT2, "attention": {"impl": "sdpa"}, "data": {"name": "synthetic"}}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        step_dir = save_checkpoint(
            run_dir / "checkpoints", 3, model=model, optimizer=torch.optim.AdamW(model.parameters()),
            trainer_state={"step": 3}, meta={"run_name": "tiny"},
            config_yaml=OmegaConf.to_yaml(config), sharded=sharded,
        )  # fmt: skip
    assert (step_dir / MODEL_OPTIM).exists() != sharded  # the format asked for
    return model, step_dir


@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_both_formats_load_the_saved_weights(tmp_path, sharded):
    saved, step_dir = _saved_run(tmp_path, sharded=sharded)
    loaded = load_for_inference(tmp_path)  # the run directory: its newest checkpoint
    assert (loaded.path, loaded.step, loaded.run_name) == (step_dir, 3, "tiny")
    want, got = saved.state_dict(), loaded.model.state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_a_longer_context_tiles_the_learned_positions(tmp_path, sharded):
    saved, _ = _saved_run(tmp_path, sharded=sharded)
    loaded = load_for_inference(tmp_path, max_seq_len=40, position_mode="copy")
    want, got = saved.state_dict(), loaded.model.state_dict()
    table = want["wpe.weight"]  # (16, 32)
    assert torch.equal(got["wpe.weight"], torch.cat([table, table, table[:8]]))  # (40, 32)
    for name, value in want.items():
        if name != "wpe.weight":
            assert torch.equal(got[name], value), name


def test_the_weights_are_held_once(tmp_path, monkeypatch):
    """The model takes the tensors the checkpoint was read into (no second copy of the weights in
    host memory): each parameter's storage is the one read_model_state returned."""
    import flashtrain.inference.checkpoint as inference_checkpoint

    _saved_run(tmp_path, sharded=False)
    read, read_model_state = {}, inference_checkpoint.read_model_state

    def reading(path):  # the real reader, remembering what it returned
        state, step_dir = read_model_state(path)
        read.update(state)
        return state, step_dir

    monkeypatch.setattr(inference_checkpoint, "read_model_state", reading)
    model = load_for_inference(tmp_path).model
    params = dict(model.named_parameters())
    assert params.keys() == read.keys()
    for name, param in params.items():
        assert param.data_ptr() == read[name].data_ptr(), name
        assert param.requires_grad and param.device.type == "cpu", name
