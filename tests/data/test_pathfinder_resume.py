"""Pathfinder generation survives interruptions: SIGTERM, Ctrl-C or kill -9 in the middle keeps the
finished chunks, leaves no temporaries and no leaked semaphores, and the next run continues to a
result bit-identical to an uninterrupted one; stale temporaries of the old format are removed."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import flashtrain.data.pathfinder.cache as pfc
import flashtrain.data.pathfinder.generator as pf
from flashtrain.data.files import exclusive_lock
from flashtrain.data.pathfinder import generate_pathfinder
from flashtrain.data.pathfinder.cache import load_or_generate, pathfinder_cache_dir

REPO = Path(__file__).resolve().parents[2]
NUM, SIZE, LENGTH, SEED = 48, 32, 6, 3

# The generating child parks once two chunks are recorded on disk: it writes PARKED and waits
# there for the test's signal. Interrupting it wherever it happened to be when a (possibly
# starved) poller looked let it finish first, or be stopped anywhere, on a loaded machine.
PARKED = "parked"
GENERATE = textwrap.dedent(
    f"""
    import faulthandler
    import signal
    import sys
    import time
    from pathlib import Path
    import flashtrain.data.pathfinder.cache as pfc
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
    pfc.CHUNK_SIZE = 2
    pfc.SAVE_EVERY_S = 0.0
    record_progress, parked = pfc._save_progress, []

    def record_then_park(work, arrays, done, *args):
        record_progress(work, arrays, done, *args)
        if len(done) >= 2 and not parked:  # once: the save on the way out must not park
            parked.append(True)
            marker = Path(sys.argv[1]) / "{PARKED}"
            marker.with_suffix(".part").write_text(str(sorted(done)))
            marker.with_suffix(".part").rename(marker)  # whole when the test sees it
            while True:  # in the parent's store(), with the worker pool running
                time.sleep(0.01)

    pfc._save_progress = record_then_park
    pfc.load_or_generate(Path(sys.argv[1]), {SIZE}, {LENGTH}, {NUM}, {SEED}, num_workers=2,
                         progress=False)
    """
)


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted result (a prefix of it for smaller counts: prefixes are stable)."""
    return generate_pathfinder(NUM, SIZE, LENGTH, SEED, num_workers=1)


@pytest.fixture
def counted(monkeypatch):
    """Images generated in this process, chunk by chunk."""
    counts = []
    real = pf._generate_range
    monkeypatch.setattr(
        pf, "_generate_range", lambda task: counts.append(task[1] - task[0]) or real(task)
    )
    return counts


def temporaries(root):
    return [p for p in Path(root).rglob("*") if p.name.endswith(".tmp")]


def done_chunks(work):
    try:
        return json.loads((work / "progress.json").read_text())["done"]
    except (OSError, ValueError):
        return []


def stopped_child_stderr(proc: subprocess.Popen, hang_guard_s: float = 300) -> str:
    """The stopped child's stderr, once it and every process holding its stderr exited. A hang
    (seen once in a full suite on a loaded machine, never in 43 runs of this test alone under
    load) fails with what is needed to find it: whether the child itself exited, its threads'
    stacks (faulthandler, SIGUSR1), and the processes still holding the pipe."""
    try:
        return proc.communicate(timeout=hang_guard_s)[1]
    except subprocess.TimeoutExpired:
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGUSR1)  # GENERATE's faulthandler: every thread's stack
            time.sleep(2)
        holders = subprocess.run(
            ["ps", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True
        ).stdout
        proc.kill()
        err = proc.communicate(timeout=60)[1] if alive else ""
        pytest.fail(
            f"the stopped generation did not end within {hang_guard_s} s (the child itself "
            f"{'still running' if alive else f'exited {proc.returncode}'}); its stderr:\n"
            f"{err[-8000:]}\nprocesses:\n{holders}"
        )


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: signal.Signals(s).name
)
def test_an_interrupted_generation_continues_to_the_same_result(
    tmp_path, sig, reference, counted, monkeypatch
):
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-c", GENERATE, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    directory = pathfinder_cache_dir(tmp_path, SIZE, LENGTH, NUM, SEED)
    work = pfc.work_dir(directory)
    deadline = time.monotonic() + 300  # generous: a loaded machine may be slow, never wrong
    while not (tmp_path / PARKED).exists():  # two chunks (of 24) safely on disk, child parked
        assert proc.poll() is None, f"child exited before parking: {proc.communicate()}"
        assert time.monotonic() < deadline, "the child did not park within 300 s"
        time.sleep(0.01)
    assert len(done_chunks(work)) >= 2
    proc.send_signal(sig)
    err = stopped_child_stderr(proc)

    assert not directory.exists()
    kept = done_chunks(work)
    assert kept == json.loads((tmp_path / PARKED).read_text())  # nothing recorded after parking
    assert 2 <= len(kept) < NUM // 2
    if sig == signal.SIGKILL:
        # no cleanup ran (the next run does it), but the workers followed their parent at once
        # (else communicate() would still wait for them to close stderr)
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == (143 if sig == signal.SIGTERM else -signal.SIGINT), err
        assert "leaked semaphore" not in err and "run again" in err, err
        assert temporaries(tmp_path) == []

    monkeypatch.setattr(pfc, "CHUNK_SIZE", 2)
    images, labels = load_or_generate(
        tmp_path, SIZE, LENGTH, NUM, SEED, num_workers=1, progress=False
    )
    assert sum(counted) == NUM - 2 * len(kept)  # only what was missing was generated
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])
    assert sorted(p.name for p in directory.iterdir()) == ["images.npy", "labels.npy", "meta.json"]
    assert not work.exists() and temporaries(tmp_path) == []


def test_resuming_with_another_chunk_size_keeps_the_covered_chunks(
    tmp_path, reference, monkeypatch, caplog
):
    real = pf._generate_range
    calls = []

    def interrupted_on_the_fourth_chunk(task):
        calls.append(task)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(pf, "_generate_range", interrupted_on_the_fourth_chunk)
    monkeypatch.setattr(pfc, "CHUNK_SIZE", 2)
    monkeypatch.setattr(pfc, "SAVE_EVERY_S", 1e9)  # only the save on the way out
    with pytest.raises(KeyboardInterrupt), caplog.at_level(logging.WARNING, logger="flashtrain"):
        load_or_generate(tmp_path, SIZE, LENGTH, 16, SEED, num_workers=1, progress=False)
    assert any("6 of 16 images are kept" in r.getMessage() for r in caplog.records)
    assert temporaries(tmp_path) == []

    counted = []
    monkeypatch.setattr(
        pf, "_generate_range", lambda task: counted.append(task[1] - task[0]) or real(task)
    )
    monkeypatch.setattr(pfc, "CHUNK_SIZE", 4)  # images 0-5 done: chunk 0-3 kept, 4-7 redone
    images, labels = load_or_generate(
        tmp_path, SIZE, LENGTH, 16, SEED, num_workers=1, progress=False
    )
    assert sum(counted) == 12
    assert np.array_equal(images, reference[0][:16]) and np.array_equal(labels, reference[1][:16])


def test_a_complete_work_directory_is_published_without_generating(tmp_path, monkeypatch):
    real_publish = pfc._publish

    def killed_before_the_rename(work, directory):
        raise KeyboardInterrupt

    monkeypatch.setattr(pfc, "_publish", killed_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        load_or_generate(tmp_path, SIZE, LENGTH, 4, SEED, num_workers=1, progress=False)
    monkeypatch.setattr(pfc, "_publish", real_publish)
    monkeypatch.setattr(pf, "_generate_range", lambda task: pytest.fail("generated again"))
    images, _ = load_or_generate(tmp_path, SIZE, LENGTH, 4, SEED, num_workers=1, progress=False)
    assert images.shape == (4, SIZE, SIZE)


def test_a_damaged_work_directory_is_discarded(tmp_path, reference, caplog):
    work = pfc.work_dir(pathfinder_cache_dir(tmp_path, SIZE, LENGTH, 4, SEED))
    work.mkdir(parents=True)
    (work / "progress.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="flashtrain"):
        images, labels = load_or_generate(
            tmp_path, SIZE, LENGTH, 4, SEED, num_workers=1, progress=False
        )
    assert any(
        "discarding" in r.getMessage() and str(work) in r.getMessage() for r in caplog.records
    )
    assert np.array_equal(images, reference[0][:4]) and np.array_equal(labels, reference[1][:4])


def test_old_format_temporaries_are_removed_only_when_nobody_writes_them(tmp_path, caplog):
    parent = tmp_path / "pathfinder"
    parent.mkdir()

    def leftover(name):
        path = parent / name
        path.mkdir()
        (path / "images.npy").write_bytes(b"\0" * 4096)
        return path

    own = leftover(".pathfinder32-len6-n4-seed3-v1.4242-0123abcd.tmp")
    free = leftover(".pathfinder32-len6-n8-seed3-v1.4243-0123abce.tmp")
    busy = leftover(".pathfinder64-len6-n8-seed3-v1.4244-0123abcf.tmp")
    unfinished = leftover(".pathfinder32-len9-n8-seed3-v1.partial")  # resumable: kept
    unrelated = parent / "notes.tmp"
    unrelated.write_text("not ours")
    with (
        exclusive_lock(parent, ".pathfinder64-len6-n8-seed3-v1.lock"),  # being generated now
        caplog.at_level(logging.INFO, logger="flashtrain"),
    ):
        load_or_generate(tmp_path, SIZE, LENGTH, 4, SEED, num_workers=1, progress=False)
    assert not own.exists() and not free.exists()
    assert busy.exists() and unfinished.exists() and unrelated.exists()
    assert any(str(unfinished) in r.getMessage() for r in caplog.records)


def test_workers_that_do_not_stop_are_killed_in_bounded_time():
    """An interrupted generation never waits on its pool without bound (it once hung under
    load in shutdown(wait=True)): a worker still busy after the grace period is killed."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    executor = ProcessPoolExecutor(1, mp_context=context)
    busy = executor.submit(time.sleep, 600)  # deaf to the stop event, as a stuck worker is
    workers = list(executor._processes.values())
    manager = executor._executor_manager_thread  # the pool's queues are its until it ends
    deadline = time.monotonic() + 120
    while not busy.running():
        assert time.monotonic() < deadline, "the worker never started its task"
        time.sleep(0.01)
    start = time.monotonic()
    pf.stop_workers(executor, context.Event(), wait_s=0.2)
    assert time.monotonic() - start < 30
    assert workers and not any(w.is_alive() for w in workers)
    assert not manager.is_alive()  # nothing of the pool is left running when it returns
