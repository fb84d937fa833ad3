"""trainer.async_checkpoint: checkpoints written in the background (flashtrain/checkpoint/
async_write.py). What is written is what a synchronous save writes, as the state was when the
save started; `latest`, meta.json and pruning wait until the save is complete; one save in
flight at most; the end of a run and a pre-emption wait for it, an error path stops it and
removes its folder; a background failure is raised as a synchronous save raises it (exit 4 for a
full disk); a kill during a background write leaves the previous checkpoint the newest one, and
resume=auto continues from it exactly."""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from config_testing import REPO, compose, train_testing
from torch import nn

import flashtrain.checkpoint.async_write as async_write
import flashtrain.train.trainer as trainer_module
from flashtrain.checkpoint import read as ckpt
from flashtrain.checkpoint.async_write import BackgroundSaves
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.file_integrity import HashingWriter
from flashtrain.no_space import NoSpaceError
from flashtrain.train import main, run
from flashtrain.train.entry import EXIT_NO_SPACE
from flashtrain.train.faults import Preempted

HANG_GUARD_S = 120  # only ever reached when something hangs


_tt = train_testing()
TINY, subprocess_env, step_losses, run_train = (
    _tt.TINY,
    _tt.subprocess_env,
    _tt.step_losses,
    _tt.run_train,
)
ASYNC = ["trainer.async_checkpoint=true", "trainer.eval_interval=0", "trainer.keep_last=0"]


@pytest.fixture(autouse=True)
def _trainer_env(monkeypatch):
    """The trainer runs here use the PyTorch attention path (these test checkpoints, not the
    kernels) and see no launcher's variables."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, x):
        return self.head(torch.relu(self.body(self.emb(x)))).logsumexp(-1).mean()


def train(model, opt, steps=1):
    for _ in range(steps):
        model(torch.randint(0, 16, (4, 5))).backward()
        opt.step()
        opt.zero_grad()


def trained():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 2)
    return model, opt


def what(model, opt, step, keep_last=0, state=None):
    """save_checkpoint's / BackgroundSaves.start's arguments after root and step."""
    return dict(
        model=model,
        optimizer=opt,
        trainer_state=state if state is not None else {"step": step},
        meta={"model_config": {"width": 8}},
        config_yaml="seed: 1\n",
        keep_last=keep_last,
    )


class HeldWrites:
    """Writes of model_optim.pt into `.step_<held>.tmp` wait at `gate` (the background writer
    held open as long as a test needs); `started` is set at the first such write, and each
    write after the gate notes whether its folder was still there."""

    def __init__(self, monkeypatch, held: int, fail: OSError | None = None):
        self.gate, self.started = threading.Event(), threading.Event()
        self.folder_there: list[bool] = []
        real = HashingWriter.write
        suffix = os.path.join(f".step_{held:06d}.tmp", ckpt.MODEL_OPTIM)

        def write(writer, data):
            name = str(writer.raw.name)
            if name.endswith(suffix):
                self.started.set()
                assert self.gate.wait(HANG_GUARD_S), "the held write was never released"
                self.folder_there.append(os.path.isdir(os.path.dirname(name)))
                if fail is not None:
                    raise fail
            return real(writer, data)

        monkeypatch.setattr(HashingWriter, "write", write)


def assert_same(a, b, where="state"):
    """Two loaded checkpoints' objects equal: tensors bit for bit, everything else by ==."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Checkpoints a and b hold the same files and the same content (meta.json apart from its
    time and checksums: torch.save's bytes may differ where the content does not; config.yaml
    apart from trainer.async_checkpoint)."""
    meta_a, meta_b = ckpt.verify_checkpoint(a), ckpt.verify_checkpoint(b)
    assert sorted(meta_a["files"]) == sorted(meta_b["files"])
    for key in set(meta_a) | set(meta_b):
        if key not in ("time", "files"):
            assert meta_a.get(key) == meta_b.get(key), key
    for name in meta_a["files"]:
        if name.endswith(".pt"):
            assert_same(
                torch.load(a / name, weights_only=False), torch.load(b / name, weights_only=False)
            )
        else:
            lines_a, lines_b = ((c / name).read_text().splitlines() for c in (a, b))
            assert [x for x in lines_a if "async_checkpoint:" not in x] == [
                x for x in lines_b if "async_checkpoint:" not in x
            ], name


def poll_until_done(saves: BackgroundSaves) -> Path:
    """poll() at 'step boundaries' until the save in flight is in place."""
    deadline = time.monotonic() + HANG_GUARD_S
    while (path := saves.poll()) is None:
        assert time.monotonic() < deadline, "the background save never completed"
        time.sleep(0.01)
    return path


# ---- BackgroundSaves ------------------------------------------------------------------------


def test_an_async_save_writes_what_a_synchronous_one_does_as_the_state_was_at_its_start(
    tmp_path, monkeypatch
):
    model, opt = trained()
    state = {"step": 2, "data": [{"pos": 3}], "rng": torch.get_rng_state()}
    reference = save_checkpoint(tmp_path / "sync", 2, **what(model, opt, 2, state=state))
    held = HeldWrites(monkeypatch, held=2)
    saves = BackgroundSaves()
    path = saves.start(tmp_path / "async", 2, **what(model, opt, 2, state=state))
    assert path == tmp_path / "async" / "step_000002" and saves.in_flight == path
    assert held.started.wait(HANG_GUARD_S)  # written in the background, and held there
    train(model, opt, 2)  # training goes on meanwhile, changing weights and optimizer in place
    state["step"] = 4
    state["data"][0]["pos"] = 7
    held.gate.set()
    assert saves.wait() == path and saves.newest == path and saves.in_flight is None
    assert_same_checkpoint(path, reference)
    fresh = Net()
    state, _ = ckpt.load_checkpoint(
        path, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters())
    )
    assert state["step"] == 2


def test_latest_meta_and_pruning_wait_until_the_save_is_complete(tmp_path, monkeypatch):
    model, opt = trained()
    root = tmp_path / "ckpts"
    first = save_checkpoint(root, 1, **what(model, opt, 1))
    held = HeldWrites(monkeypatch, held=2)
    saves = BackgroundSaves()
    saves.start(root, 2, **what(model, opt, 2, keep_last=1))
    assert held.started.wait(HANG_GUARD_S)
    for _ in range(3):  # step boundaries while it is written: nothing moves
        assert saves.poll() is None
        assert (root / "latest").read_text().strip() == first.name
        assert [c.path for c in ckpt.find_checkpoints(root)] == [first]
        assert not (root / "step_000002").exists() and (root / ".step_000002.tmp").is_dir()
        assert not (root / ".step_000002.tmp" / "meta.json").exists()
        assert ckpt.resolve_resume("auto", root) == first
    held.gate.set()
    path = poll_until_done(saves)
    assert path == root / "step_000002" and (root / "latest").read_text().strip() == path.name
    assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == ["latest", path.name]
    ckpt.verify_checkpoint(path)


def test_one_save_in_flight_the_next_waits_for_it(tmp_path, monkeypatch):
    model, opt = trained()
    root = tmp_path / "ckpts"
    held = HeldWrites(monkeypatch, held=1)
    saves = BackgroundSaves()
    saves.start(root, 1, **what(model, opt, 1))
    assert held.started.wait(HANG_GUARD_S)
    seen_at_the_second_start = []
    real_begin = async_write.begin_save

    def begin_save(root, step):  # what is complete when the second save makes its folder
        seen_at_the_second_start.append([c.step for c in ckpt.find_checkpoints(root)])
        return real_begin(root, step)

    monkeypatch.setattr(async_write, "begin_save", begin_save)
    second = threading.Thread(target=lambda: saves.start(root, 2, **what(model, opt, 2)))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first, held
    assert seen_at_the_second_start == []
    held.gate.set()
    second.join(HANG_GUARD_S)
    assert seen_at_the_second_start == [[1]]  # the first was complete before the second began
    assert saves.newest == root / "step_000001" and saves.in_flight == root / "step_000002"
    assert saves.wait() == root / "step_000002"
    assert [c.step for c in ckpt.find_checkpoints(root)] == [1, 2]


@pytest.mark.parametrize(
    ("code", "line"),
    [
        (errno.ENOSPC, "no space left on the device writing checkpoint {ckpt}: the partial "
         "checkpoint was removed, the earlier ones are intact; free space on {root} "),
        (errno.EDQUOT, "disk quota exceeded writing checkpoint {ckpt}: the partial checkpoint "
         "was removed, the earlier ones are intact; free space in your disk quota on {root} "),
    ],
)  # fmt: skip
def test_a_failed_background_write_is_raised_as_a_synchronous_save_raises_it(
    tmp_path, monkeypatch, code, line
):
    """A full disk and a spent quota (issue 56, item 10) alike: NoSpaceError (train.py's exit
    4), the same line from either writer, the partial checkpoint removed."""
    model, opt = trained()
    root = tmp_path / "ckpts"
    save_checkpoint(root, 1, **what(model, opt, 1))
    held = HeldWrites(monkeypatch, held=2, fail=OSError(code, os.strerror(code)))
    held.gate.set()  # the disk is full, or the quota spent
    with pytest.raises(NoSpaceError) as sync_error:
        save_checkpoint(root, 2, **what(model, opt, 2))
    saves = BackgroundSaves()
    saves.start(root, 2, **what(model, opt, 2))
    with pytest.raises(NoSpaceError) as async_error:
        poll_until_done(saves)  # raised at a step boundary
    assert str(async_error.value) == str(sync_error.value)
    assert str(async_error.value).startswith(line.format(ckpt=root / "step_000002", root=root))
    assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == ["latest", "step_000001"]
    assert saves.in_flight is None and saves.newest is None
    assert saves.wait() is None  # nothing left in flight


def test_close_stops_the_writer_before_removing_its_folder(tmp_path, monkeypatch, caplog):
    model, opt = trained()
    root = tmp_path / "ckpts"
    save_checkpoint(root, 1, **what(model, opt, 1))
    held = HeldWrites(monkeypatch, held=2)
    saves = BackgroundSaves()
    saves.start(root, 2, **what(model, opt, 2))
    assert held.started.wait(HANG_GUARD_S)
    threading.Timer(0.2, held.gate.set).start()  # the writer goes on after close() began
    with caplog.at_level(logging.WARNING, logger="flashtrain"):
        saves.close()
    assert held.folder_there and all(held.folder_there)  # removed only after the last write
    assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == ["latest", "step_000001"]
    assert "step_000002 was being written in the background when the run stopped" in caplog.text


# ---- the trainer ----------------------------------------------------------------------------


def slowed_writes(monkeypatch, folder: str, seconds: float) -> None:
    """The first write into `folder` (a `.step_N.tmp` name) takes `seconds` longer."""
    real = HashingWriter.write
    slowed = []

    def write(writer, data):
        if folder in str(writer.raw.name) and not slowed:
            slowed.append(True)
            time.sleep(seconds)
        return real(writer, data)

    monkeypatch.setattr(HashingWriter, "write", write)


def test_a_run_trains_as_with_synchronous_saves_and_waits_for_the_last(
    tmp_path, monkeypatch, caplog
):
    steps = ["trainer.max_steps=4", "trainer.ckpt_interval=2"]
    sync = run(compose(TINY + steps + ASYNC[1:]), tmp_path / "sync")
    slowed_writes(monkeypatch, ".step_000004.tmp", 0.3)  # the end comes before it is written
    with caplog.at_level(logging.INFO, logger="flashtrain"):
        out = run(compose(TINY + steps + ASYNC), tmp_path / "async")
    assert out["losses"] == sync["losses"]
    root = tmp_path / "async" / "checkpoints"
    assert [c.step for c in ckpt.find_checkpoints(root)] == [2, 4]
    assert (root / "latest").read_text().strip() == "step_000004"
    assert out["checkpoint"] == str(root / "step_000004") and not list(root.glob(".step_*"))
    for step in ("step_000002", "step_000004"):
        assert_same_checkpoint(root / step, tmp_path / "sync" / "checkpoints" / step)
        assert f"checkpoint: writing {root / step} in the background" in caplog.text
        assert f"checkpoint: {root / step} (written in the background, " in caplog.text


def test_a_preemption_waits_for_the_save_in_flight(tmp_path, monkeypatch):
    train_step = trainer_module.Trainer._train_step

    def sigterm_in_step_3(self, preempt):
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return train_step(self, preempt)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", sigterm_in_step_3)
    slowed_writes(monkeypatch, ".step_000003.tmp", 0.3)
    cfg = compose(TINY + ASYNC + ["trainer.max_steps=10", "trainer.ckpt_interval=0"])
    with pytest.raises(Preempted) as err:
        run(cfg, tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    assert err.value.step == 3 and err.value.ckpt == str(root / "step_000003")
    assert [c.step for c in ckpt.find_checkpoints(root)] == [3]
    ckpt.verify_checkpoint(root / "step_000003")


def test_an_error_while_a_save_is_in_flight_leaves_no_writer_and_no_folder(tmp_path, monkeypatch):
    held = HeldWrites(monkeypatch, held=2)
    train_step = trainer_module.Trainer._train_step

    def crash_at_step_3(self, preempt):
        if self.step == 2:
            assert held.started.wait(HANG_GUARD_S)
            threading.Timer(0.2, held.gate.set).start()  # still writing as the run stops
            raise RuntimeError("crashed at step 3")
        return train_step(self, preempt)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", crash_at_step_3)
    cfg = compose(TINY + ASYNC + ["trainer.max_steps=4", "trainer.ckpt_interval=1"])
    with pytest.raises(RuntimeError, match="crashed at step 3"):
        run(cfg, tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    assert held.folder_there and all(held.folder_there)
    assert sorted(p.name for p in root.iterdir() if p.name != ".lock") == ["latest", "step_000001"]


def test_a_full_disk_in_the_background_is_one_line_and_exit_4(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    real_write = HashingWriter.write

    def write(self, data):  # the disk fills while the second checkpoint is written
        if ".step_000002.tmp" in str(self.raw.name):
            real_write(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(HashingWriter, "write", write)
    ckpt_dir = tmp_path / "ckpts"
    cfg = compose(
        TINY
        + ASYNC
        + ["trainer.max_steps=3", "trainer.ckpt_interval=1", f"trainer.ckpt_dir={ckpt_dir}"]
    )
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_NO_SPACE
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    expected = f"no space left on the device writing checkpoint {ckpt_dir / 'step_000002'}"
    assert expected in errors[0]
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.name != ".lock") == [
        "latest",
        "step_000001",
    ]
    ckpt.verify_checkpoint(ckpt_dir / "step_000001")


KILL_HOOK = """
import os, runpy, sys, threading
from flashtrain.file_integrity import HashingWriter

real = HashingWriter.write

def write(self, data):  # step 4's background write: say it started, then hold it until killed
    if ".step_000004.tmp" in str(self.raw.name):
        open(os.environ["WRITING_STARTED"], "w").close()
        threading.Event().wait()
    return real(self, data)

HashingWriter.write = write
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""


def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    """A real run SIGKILLed while step 4 is written in the background (held there by a hook
    in a wrapper script, so the kill always lands mid-write): step 2 is the newest checkpoint,
    and resume=auto continues from it exactly as the killed run went on."""
    script = tmp_path / "held_write.py"
    script.write_text(KILL_HOOK.format(train=str(REPO / "train.py")))
    started = tmp_path / "writing-started"
    args = TINY + ASYNC + ["trainer.max_steps=6", "trainer.ckpt_interval=2"]
    proc = subprocess.Popen(
        [sys.executable, str(script), *args, "hydra.run.dir=out"],
        cwd=tmp_path,
        env=subprocess_env(WRITING_STARTED=str(started)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "out" / "metrics.jsonl"
    try:  # until step 4 is being written, and steps 5 and 6 trained meanwhile (step 6's own
        # save then waits for step 4's)
        deadline = time.monotonic() + HANG_GUARD_S
        while not (started.exists() and metrics.exists() and 6 in step_losses(metrics)):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the run never reached its held write"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        output = proc.communicate(timeout=HANG_GUARD_S)[0]
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    root = tmp_path / "out" / "checkpoints"
    assert "checkpoint: writing" in output and str(root / "step_000004") in output
    assert [c.step for c in ckpt.find_checkpoints(root)] == [2]
    assert (root / "latest").read_text().strip() == "step_000002"
    assert (root / ".step_000004.tmp").is_dir()  # the partial folder, never a checkpoint
    assert ckpt.resolve_resume("auto", root) == root / "step_000002"
    killed = step_losses(metrics)

    resumed = run(compose(args + ["trainer.resume=auto"]), tmp_path / "out")
    assert dict(resumed["losses"]) == {s: killed[s] for s in (3, 4, 5, 6)}  # exactly
    assert [c.step for c in ckpt.find_checkpoints(root)] == [2, 4, 6]
    assert not list(root.glob(".step_*"))  # the next save cleared the partial folder away


@pytest.mark.slow  # ~33 s on 2 busy cores (15 s quiet): two 2-process torchrun runs
def test_fsdp2_async_checkpoints_resume_exactly(tmp_path):
    first = TINY + ASYNC + ["trainer.max_steps=4", "trainer.ckpt_interval=2"]
    first += ["trainer.strategy=fsdp"]
    res = run_train(first + ["hydra.run.dir=a"], cwd=tmp_path, nproc=2, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "in the background" in res.stdout + res.stderr
    root = tmp_path / "a" / "checkpoints"
    ckpts = ckpt.find_checkpoints(root)
    assert [c.step for c in ckpts] == [2, 4]
    for info in ckpts:
        meta = ckpt.verify_checkpoint(info.path)
        assert meta["format"] == "dcp" and {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    assert not list(root.glob(".step_*"))
    full = step_losses(tmp_path / "a" / "metrics.jsonl")

    resume = first + [f"trainer.resume={ckpts[0].path}", "hydra.run.dir=b"]
    res = run_train(resume, cwd=tmp_path, nproc=2, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = step_losses(tmp_path / "b" / "metrics.jsonl")
    assert resumed == {s: full[s] for s in (3, 4)}  # exactly


FULL_DISK_ON_RANK_0 = """
import errno, os, runpy, sys
from flashtrain.file_integrity import HashingWriter

real = HashingWriter.write

def write(self, data):  # rank 0's background write of step 2 finds the disk full
    if ".step_000002.tmp" in str(self.raw.name):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(self, data)

HashingWriter.write = write
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.mark.slow  # ~15 s on 2 busy cores (7 s quiet): a 2-process torchrun run
def test_a_full_disk_in_rank_0s_background_write_ends_both_ranks_with_exit_4(tmp_path):
    """DDP: only rank 0 writes; the other rank learns of its failure at the step boundary where
    they agree the save is done, instead of waiting for it until the process group times out."""
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK_ON_RANK_0.format(train=str(REPO / "train.py")))
    ckpt_dir = tmp_path / "ckpts"
    args = TINY + ASYNC + ["trainer.max_steps=4", "trainer.ckpt_interval=1"]
    args += [f"trainer.ckpt_dir={ckpt_dir}", "trainer.dist_timeout_s=60"]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={_tt.free_port()}",
            "--monitor-interval=0.2",
            str(script),
            *args,
        ],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=_tt.HANG_GUARD_S,
    )
    out = res.stdout + res.stderr
    assert re.search(r"failed \(exitcode: 4\) local_rank: [01]", out), out[-3000:]
    assert not re.search(r"exitcode\s*:\s*1\b", out), out[-3000:]
    assert "no space left on the device writing checkpoint" in out
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.name != ".lock") == [
        "latest",
        "step_000001",
    ]
