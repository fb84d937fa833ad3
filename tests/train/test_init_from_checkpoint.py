"""model.init_from=<a trainer checkpoint folder>: a step folder or a checkpoints folder, in either of
the trainer's formats (torch; dcp, FSDP2's sharded checkpoints with no model_optim.pt), loads the
saved weights into a model at a longer context; the files are checked first. The saved weights
are read back independently: torch's own dcp_to_torch_save, or the model that was saved.
(Two FSDP2 ranks' checkpoint: tests/train/test_llama_train.py.)"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from train_testing import HANG_GUARD_S, free_port, subprocess_env

from flashtrain.checkpoint import CheckpointError, initial_weights
from flashtrain.checkpoint import read as ckpt
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.models import build_model

TINY_LLAMA = dict(
    arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, max_seq_len=32,
    vocab_size=97, rope_theta=10000.0,
)  # fmt: skip
TINY_GPT2 = dict(arch="gpt2", n_layer=1, n_head=2, d_model=32, vocab_size=97, max_seq_len=32)


def _trained_checkpoint(cfg: dict, root, *, sharded: bool, step: int = 5):
    """A model after one optimizer step (weights off their init), saved as a trainer checkpoint
    in one process; returns (model, step folder)."""
    torch.manual_seed(0)
    model = build_model(cfg, "sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 97, (2, 16))
    model(ids, ids).loss.backward()
    opt.step()
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        path = save_checkpoint(
            root, step, model=model, optimizer=opt, trainer_state={"step": step},
            meta={"model_config": dataclasses.asdict(model.config)}, sharded=sharded,
        )  # fmt: skip
    return model, path


def _initialised(cfg: dict, ref) -> torch.nn.Module:
    """A model built from `cfg` with model.init_from=ref, given its initial weights as the
    trainer does (flashtrain.checkpoint.initial_weights)."""
    model = build_model({**cfg, "init_from": str(ref)}, "sdpa")
    initial_weights(model, model.config.init_from)
    return model


def _saved_model(step_dir, tmp_path) -> dict[str, torch.Tensor]:
    """The model entries of a DCP checkpoint, through torch's own converter."""
    out = tmp_path / "converted.pt"
    dcp_to_torch_save(step_dir, out)
    return torch.load(out, weights_only=True)["model"]


LONGER = dict(max_seq_len=128, rope_scaling=dict(type="linear", factor=4.0))


@pytest.mark.parametrize("folder", ["step", "checkpoints"])
def test_a_dcp_checkpoint_loads_at_a_longer_context(tmp_path, folder):
    trained, step_dir = _trained_checkpoint(TINY_LLAMA, tmp_path / "ckpts", sharded=True)
    assert not (step_dir / ckpt.MODEL_OPTIM).exists()  # what init_from could not read before
    saved = _saved_model(step_dir, tmp_path)
    assert saved.keys() == trained.state_dict().keys()
    ref = step_dir if folder == "step" else step_dir.parent
    longer = _initialised({**TINY_LLAMA, **LONGER}, ref)
    got = longer.state_dict()
    assert got.keys() == saved.keys()
    for name, value in saved.items():
        assert torch.equal(got[name], value), name
    # and it runs at the longer context: position interpolation, position 4p is the old p
    ids = torch.randint(0, 97, (1, 32))
    with torch.no_grad():
        a = trained.hidden_states(ids, position_ids=torch.arange(32)[None])
        b = longer.hidden_states(ids, position_ids=torch.arange(32)[None] * 4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_newest_torch_checkpoint_of_a_folder_loads(tmp_path):
    _trained_checkpoint(TINY_LLAMA, tmp_path / "ckpts", sharded=False, step=3)
    newest, step_dir = _trained_checkpoint(TINY_LLAMA, tmp_path / "ckpts", sharded=False, step=7)
    assert step_dir.name == "step_000007"
    model = _initialised({**TINY_LLAMA, **LONGER}, tmp_path / "ckpts")
    for name, value in newest.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_learned_positions_are_resized_from_a_dcp_checkpoint(tmp_path):
    """The checkpoint's shapes come from its own metadata, so a table longer in this model
    (GPT-2's wpe at twice the context) loads and is interpolated as for a torch file."""
    trained, step_dir = _trained_checkpoint(TINY_GPT2, tmp_path / "ckpts", sharded=True)
    from_file = tmp_path / "weights.pt"
    torch.save(trained.state_dict(), from_file)
    longer = {**TINY_GPT2, "max_seq_len": 64}
    a = _initialised(longer, step_dir).state_dict()
    b = _initialised(longer, from_file).state_dict()
    assert a["wpe.weight"].shape == (64, 32)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path):
    _, step_dir = _trained_checkpoint(TINY_LLAMA, tmp_path / "ckpts", sharded=True)
    shard = step_dir / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.init_from=.*__0_0\.distcp"):
        _initialised(TINY_LLAMA, step_dir)


def test_folders_without_a_checkpoint_are_refused(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    # a run folder is looked into: the message names its checkpoints folder
    where = re.escape(str(run / "checkpoints"))
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {where}\b"):
        _initialised(TINY_LLAMA, run)
    _trained_checkpoint(TINY_GPT2, run / "checkpoints", sharded=False)
    with pytest.raises(ValueError, match=r"init_from=.* does not fit this model"):
        _initialised(TINY_LLAMA, run / "checkpoints")


def test_a_reference_to_no_weights_is_refused_saying_what_it_may_name(tmp_path):
    """Nothing at the path: a FileNotFoundError naming it and the kinds of reference; a file
    that holds no torch state dict: a ValueError naming model.init_from. Either before the
    model's weights are touched."""
    model = build_model(TINY_LLAMA, "sdpa")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    missing = tmp_path / "no_such_run"
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(str(missing))}: no such file"):
        initial_weights(model, str(missing))
    with pytest.raises(FileNotFoundError, match=r"trainer checkpoint folder.*hf:PATH_OR_ID"):
        initial_weights(model, str(missing))
    notes = tmp_path / "notes.txt"
    notes.write_text("not weights")
    with pytest.raises(ValueError, match=r"model.init_from=.*notes\.txt is not a torch state"):
        initial_weights(model, str(notes))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


RANKS_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def main(rank, step_dir, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from flashtrain.checkpoint import initial_weights
        from flashtrain.checkpoint import manifest as checkpoint_manifest
        from flashtrain.models import build_model

        hashed = []
        real_hash = checkpoint_manifest.hash_file
        checkpoint_manifest.hash_file = lambda p, *a: hashed.append(p.name) or real_hash(p, *a)
        cfg = json.loads(os.environ["MODEL_CFG"])
        model = build_model({**cfg, "init_from": step_dir}, "sdpa")
        initial_weights(model, model.config.init_from)
        state = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"hashed": hashed, "state": state}, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.start_processes(main, args=(sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2,
                           start_method="fork")
    """
)


@pytest.mark.slow  # ~27 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_under_torchrun_rank_0_alone_checks_the_files(tmp_path):
    """Every rank builds the model and reads the weights, but the checkpoint's files are hashed
    once, on rank 0 (as a resume does), not once per rank."""
    saved, step_dir = _trained_checkpoint(TINY_GPT2, tmp_path / "ckpts", sharded=False)
    env = {**subprocess_env(), "MODEL_CFG": json.dumps(TINY_GPT2)}
    res = subprocess.run(
        [sys.executable, "-c", RANKS_WORKER, str(step_dir), str(free_port()), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    listed = sorted(json.loads((step_dir / "meta.json").read_text())["files"])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(ranks[0]["hashed"]) == listed and ranks[1]["hashed"] == []
    for rank in ranks:
        for name, value in saved.state_dict().items():
            assert torch.equal(torch.tensor(rank["state"][name]), value), name
