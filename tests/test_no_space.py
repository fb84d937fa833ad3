"""A write refused for want of space (a full disk, ENOSPC, or a spent quota, EDQUOT) is told apart
from every other failure in whatever a library wrapped it (flashtrain/no_space.py): the shapes
torch.save, `datasets`, torch.distributed.checkpoint, pyarrow and the Rust libraries give it, and
real refusals of /dev/full (a device every write to which fails as on a full disk). The writers'
own lines: tests/checkpoint/test_async_checkpoint.py (checkpoints),
tests/data/test_data_corpus_build.py (token caches), tests/checkpoint/test_export_safety.py."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from flashtrain.no_space import NoSpaceError, no_space_errno, no_space_named, refused_file, unnamed

FULL, QUOTA = errno.ENOSPC, errno.EDQUOT


def caused(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def during(outer: BaseException, inner: BaseException) -> BaseException:
    """`outer` raised while `inner` was being handled (its __context__, as `from None` keeps)."""
    outer.__context__ = inner
    outer.__suppress_context__ = True
    return outer


def refusal(code: int, filename: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), *([filename] if filename else []))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (refusal(FULL), FULL),
        (refusal(QUOTA), QUOTA),
        # torch.save: the enforce failure caused by the file object's OSError
        (caused(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"),
                refusal(QUOTA)), QUOTA),
        # datasets: DatasetGenerationError("An error occurred ...") from the writer's OSError
        (caused(Exception("An error occurred while generating the dataset"), refusal(FULL)), FULL),
        (during(ValueError("could not read corpus.jsonl"), refusal(QUOTA)), QUOTA),
        # DCP collects its writers' errors as text; pyarrow's OSError may carry no errno
        (RuntimeError("rank 1: OSError: [Errno 122] Disk quota exceeded"), QUOTA),
        (OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"), FULL),
        (Exception("I/O error: Disk quota exceeded (os error 122)"), QUOTA),  # safetensors
        (refusal(errno.EACCES), None),
        (caused(RuntimeError("[Errno 2] No such file"), refusal(errno.EROFS)), None),
        (ValueError("bad value"), None),
        (None, None),
    ],
)  # fmt: skip
def test_a_refusal_for_want_of_space_is_found_in_what_wrapped_it(error, code):
    assert no_space_errno(error) == code


def test_a_cycle_of_causes_ends_the_search():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert no_space_errno(a) is None


def _full_device() -> Path:
    device = Path("/dev/full")
    if not (device.exists() and stat.S_ISCHR(device.stat().st_mode)):
        pytest.skip("no /dev/full character device here")
    return device


def test_real_refusals_of_a_full_device_are_found():
    """The independent reference: what Python, torch.save (through a file object, as the
    checkpoint writer calls it) and pyarrow (`datasets`' writer) really raise on a full disk."""
    import pyarrow as pa

    device = _full_device()
    raised = []
    for write in (
        lambda f: f.write(b"x" * 100_000),
        lambda f: torch.save({"weights": torch.zeros(100_000)}, f),
    ):
        with pytest.raises(Exception) as failure:  # noqa: PT011 - any shape: that is the point
            with open(device, "wb") as f:  # opened in place: nothing replaces the device
                write(f)
        raised.append(failure.value)
    with pytest.raises(Exception) as failure, pa.OSFile(str(device), "wb") as f:  # noqa: PT011
        f.write(b"x" * 100_000)
    raised.append(failure.value)
    assert [no_space_errno(e) for e in raised] == [FULL] * 3, raised


def test_a_writer_names_the_refusal_and_passes_everything_else():
    def message(code, refused):
        return f"{code} {refused}"

    with pytest.raises(NoSpaceError, match=f"^{QUOTA} /cache/x.bin$") as named:
        with no_space_named(message):
            raise caused(RuntimeError("wrapped"), refusal(QUOTA, "/cache/x.bin"))
    assert no_space_errno(named.value.__cause__) == QUOTA  # the traceback still shows it
    with pytest.raises(KeyError), no_space_named(message):
        raise KeyError("text")


def test_a_refusal_no_writer_named_is_one_line_naming_the_file():
    error = caused(RuntimeError("logging failed"), refusal(QUOTA, "/runs/a/metrics.jsonl"))
    assert refused_file(error) == Path("/runs/a/metrics.jsonl")
    line = str(unnamed(error, "then run again"))
    assert line == (
        "disk quota exceeded writing /runs/a/metrics.jsonl; free space in your disk quota on "
        "/runs/a, then run again"
    )
    assert "\n" not in str(unnamed(RuntimeError("x\n[Errno 28] No space left on device"), "."))
    assert unnamed(ValueError("bad value"), "then run again") is None


def test_a_refused_atomic_write_names_its_file_and_leaves_nothing(tmp_path):
    """A file's write error names no file; atomic_path's (config.yaml, reports, caches) does,
    so the one line names what was being written."""
    from flashtrain.data.files import atomic_path

    target = tmp_path / "config.yaml"
    with pytest.raises(OSError) as refused, atomic_path(target) as tmp:
        tmp.write_text("seed: 1\n")
        raise refusal(QUOTA)  # as the write of a full disk raises it: no file named
    assert refused_file(refused.value) == target and no_space_errno(refused.value) == QUOTA
    assert list(tmp_path.iterdir()) == []
