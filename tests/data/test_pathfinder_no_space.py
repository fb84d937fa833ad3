"""A Pathfinder generation on a full disk (or over quota): its arrays' space is reserved before
any image is generated, so the disk filling is one line naming the cache and data.cache_dir
(NoSpaceError: train.py and prepare_data.py exit 4), never the SIGBUS that a memory-mapped write
into a sparse file on a full disk is; a continued generation's finished images are kept. The
reservation is refused here as a full disk refuses it (os.posix_fallocate), and once for real on
a 64 KiB tmpfs in a private mount namespace."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flashtrain.data.pathfinder.cache as pfc
import flashtrain.data.pathfinder.generator as pf
from flashtrain.data.pathfinder import generate_pathfinder
from flashtrain.data.pathfinder.cache import load_or_generate, pathfinder_cache_dir
from flashtrain.no_space import NoSpaceError

SIZE, LENGTH, SEED, NUM = 32, 6, 3, 6


def refuse_reservations(monkeypatch, code: int = errno.ENOSPC) -> None:
    def full(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", full)


def generate(root):
    return load_or_generate(root, SIZE, LENGTH, NUM, SEED, num_workers=1, progress=False)


def test_a_full_disk_is_one_line_before_any_image_and_keeps_nothing(tmp_path, monkeypatch):
    directory = pathfinder_cache_dir(tmp_path, SIZE, LENGTH, NUM, SEED)
    refuse_reservations(monkeypatch, errno.EDQUOT)
    monkeypatch.setattr(pf, "_generate_range", lambda task: pytest.fail("generated on a full disk"))
    with pytest.raises(NoSpaceError) as refused:
        generate(tmp_path)
    assert str(refused.value) == (
        f"disk quota exceeded generating the Pathfinder cache {directory}: nothing of it was "
        f"kept; free space in your disk quota on {tmp_path} (data.cache_dir), or set "
        "data.cache_dir to a folder on another disk"
    )
    assert not pfc.work_dir(directory).exists() and not directory.exists()


class Stopped(Exception):
    """A generation stopped part way (as by a kill, but an exception the session survives)."""


def test_a_full_disk_when_continuing_keeps_the_images_generated(tmp_path, monkeypatch):
    monkeypatch.setattr(pfc, "CHUNK_SIZE", 2)
    real = pf._generate_range
    chunks = []

    def stopped_at_the_second_chunk(task):
        if chunks:
            raise Stopped
        chunks.append(task)
        return real(task)

    monkeypatch.setattr(pf, "_generate_range", stopped_at_the_second_chunk)
    with pytest.raises(Stopped):
        generate(tmp_path)
    work = pfc.work_dir(pathfinder_cache_dir(tmp_path, SIZE, LENGTH, NUM, SEED))
    done = (work / "progress.json").read_text()
    refuse_reservations(monkeypatch)
    with pytest.raises(NoSpaceError, match=f"the images generated so far are kept in {work} "):
        generate(tmp_path)
    assert (work / "progress.json").read_text() == done  # not discarded as unusable
    monkeypatch.undo()
    images, labels = generate(tmp_path)
    expected = generate_pathfinder(NUM, SIZE, LENGTH, SEED, num_workers=1)
    assert np.array_equal(images, expected[0]) and np.array_equal(labels, expected[1])


IN_A_FULL_TMPFS = """
mount -t tmpfs -o size=64k tmpfs "$1" || exit 77
shift
exec "$@"
"""
GENERATE = textwrap.dedent(
    f"""
    import sys
    from pathlib import Path
    from flashtrain.data.pathfinder.cache import load_or_generate
    from flashtrain.no_space import NoSpaceError
    try:  # 200 images of 32 x 32: 200 KiB, more than the 64 KiB there
        load_or_generate(Path(sys.argv[1]), {SIZE}, {LENGTH}, 200, {SEED}, progress=False)
    except NoSpaceError as e:
        print(e)
    """
)


def test_a_real_full_disk_is_the_line_not_sigbus(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    disk = tmp_path / "disk"
    disk.mkdir()
    res = subprocess.run(
        ["unshare", "-rm", "sh", "-c", IN_A_FULL_TMPFS, "sh", str(disk),
         sys.executable, "-c", GENERATE, str(disk)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if res.returncode == 77 or "unshare failed" in res.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {res.stderr[-300:]}")
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])  # -7: killed by SIGBUS
    assert res.stdout.startswith("no space left on the device generating the Pathfinder cache")
