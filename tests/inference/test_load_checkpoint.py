"""flashtrain.checkpoint.load_model reads a run's checkpoint in either of the trainer's formats:
"torch" (model_optim.pt) and "dcp" (FSDP2's shards, no model_optim.pt; written here from one
process). The loaded model holds exactly the saved weights; at a longer
context GPT-2's learned position table is the saved one tiled (position_mode=copy)."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.read import MODEL_OPTIM
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.models import build_model

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
    model, info = load_model(tmp_path)  # the run directory: its newest checkpoint
    assert (info.path, info.step, info.run_name) == (step_dir, 3, "tiny")
    want, got = saved.state_dict(), model.state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_a_longer_context_tiles_the_learned_positions(tmp_path, sharded):
    saved, _ = _saved_run(tmp_path, sharded=sharded)
    model, _ = load_model(tmp_path, max_seq_len=40, position_mode="copy")
    want, got = saved.state_dict(), model.state_dict()
    table = want["wpe.weight"]  # (16, 32)
    assert torch.equal(got["wpe.weight"], torch.cat([table, table, table[:8]]))  # (40, 32)
    for name, value in want.items():
        if name != "wpe.weight":
            assert torch.equal(got[name], value), name


def _mapped_ranges(file) -> list[tuple[int, int]]:
    """The address ranges of this process that map `file` (/proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(file):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def test_the_weights_are_held_once(tmp_path, monkeypatch):
    """One copy of the weights in host memory, the model's: the checkpoint file is memory-mapped
    (the tensors read are its pages, not a second copy in memory, copied into the parameters
    tensor by tensor), and a checkpoint holding every weight draws no fresh weights first."""
    import flashtrain.checkpoint.sources as sources

    _, step_dir = _saved_run(tmp_path, sharded=False)
    read, torch_load = {}, sources.torch_load

    def reading(file, **kwargs):  # the real reader, remembering what it returned
        state = torch_load(file, **kwargs)
        read.update(state["model"])
        return state

    monkeypatch.setattr(sources, "torch_load", reading)
    rng = torch.get_rng_state()
    model, _ = load_model(tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)  # no fresh init drawn, to be overwritten
    mapped = _mapped_ranges((step_dir / MODEL_OPTIM).resolve())
    assert mapped, "model_optim.pt is not memory-mapped"
    params = dict(model.named_parameters())
    assert params.keys() == read.keys()
    for name, param in params.items():
        assert any(lo <= read[name].data_ptr() < hi for lo, hi in mapped), name  # file pages
        assert not any(lo <= param.data_ptr() < hi for lo, hi in mapped), name
        assert torch.equal(param.detach(), read[name]), name
        assert param.requires_grad and param.device.type == "cpu", name
