"""Several nodes on one machine: two torchrun launches ("nodes") of two ranks each, rendezvous
through c10d on 127.0.0.1, each in its own working directory, train as one node of four ranks
does (DDP and FSDP2, the same losses); a checkpoint folder that is not the same folder on every
rank (a relative trainer.ckpt_dir under the nodes' own working directories, as a node-local path
would be) is refused at start, in one line naming the setting, before anything trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from train_testing import TINY, free_port, step_losses, subprocess_env

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"
STEPS = ["trainer.max_steps=3", "trainer.eval_interval=0", "trainer.ckpt_interval=0"]


def _launch(cwd: Path, nnodes: int, nproc: int, endpoint: str, args: list[str]):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=multi-node-test", "--monitor-interval=0.2", str(TRAIN_PY), *args,
    ]  # fmt: skip
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        cmd, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def _nodes(tmp_path: Path, nnodes: int, nproc: int, args: list[str]) -> list[tuple[int, str]]:
    """Launch `nnodes` torchrun agents of `nproc` ranks, each in tmp_path/node<i>; wait for all;
    [(exit code, output)] per node."""
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [_launch(tmp_path / f"node{i}", nnodes, nproc, endpoint, args) for i in range(nnodes)]
    return [(agent.wait(timeout=300), agent.stdout.read()) for agent in agents]


def _run_folder(tmp_path: Path) -> Path:
    """The one run folder the job made: rank 0's, on whichever node the rendezvous made first."""
    (folder,) = tmp_path.glob("node*/outputs/*/*")
    return folder


@pytest.mark.slow  # ~70 s on 2 busy cores: four launches of four gloo ranks
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_nodes_of_two_ranks_train_as_one_node_of_four(tmp_path, strategy):
    args = [*TINY, *STEPS, f"trainer.strategy={strategy}", "micro_batch_size=2"]
    one = _nodes(tmp_path / "one", 1, 4, args)
    two = _nodes(tmp_path / "two", 2, 2, args)
    for code, out in one + two:
        assert code == 0, out[-4000:]
    want = step_losses(_run_folder(tmp_path / "one") / "metrics.jsonl")
    got = step_losses(_run_folder(tmp_path / "two") / "metrics.jsonl")
    assert sorted(want) == [1, 2, 3]
    assert got == want  # the same ranks, the same reductions: the same numbers
    assert "world: 4" in "".join(out for _, out in two)


def test_a_checkpoint_folder_not_shared_by_every_node_is_refused_before_training(tmp_path):
    """trainer.ckpt_dir=ckpt is a folder in each node's working directory: rank 0 writes the
    check's file in its own, and the other node's rank cannot read it."""
    nodes = _nodes(tmp_path, 2, 1, [*TINY, *STEPS, "trainer.ckpt_dir=ckpt"])
    for code, _ in nodes:
        assert code != 0
    out = "".join(text for _, text in nodes)
    line = next(x for x in out.splitlines() if "is not the same folder on every rank" in x)
    assert "trainer.ckpt_dir" in line and "rank 1 (host" in line
    assert "file system every node mounts" in line
    assert "train/loss" not in out  # refused before the first step
