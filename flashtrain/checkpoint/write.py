"""Writing checkpoints: atomic, collective, the last K kept (the layout: read.py).

Everything is written into `.step_000200.tmp/` and renamed into place only when complete, so a
kill at any moment leaves the previous checkpoints intact and never a half-written `latest`.
Every file is hashed while it is written; meta.json, written last, lists them all. A failure on
any rank fails the save on every rank and removes the partial folder; a full disk or a spent
quota raises NoSpaceError. Pruning removes a checkpoint's meta.json before the rest, so a prune cut short never
leaves something that looks like a checkpoint but lacks its tensors.

A folder holds one line of checkpoints: a run that continues from an older step (a resume from
it, or a save of an older step) moves the newer ones aside into abandoned/ first
(set_aside_newer_checkpoints), so pruning and every "newest" lookup see the run's own line only.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from flashtrain.checkpoint.manifest import (
    META,
    CheckpointError,
    HashingStorageWriter,
    Manifest,
    complete_manifest,
    write_hashed,
)
from flashtrain.checkpoint.read import (
    CKPT_RE,
    CONFIG,
    FORMAT_VERSION,
    MODEL_OPTIM,
    TRAINER_STATE,
    checkpoint_name,
    checkpoint_step,
    find_checkpoints,
    read_meta,
)
from flashtrain.checkpoint.run_lock import RunLock, holds_lock
from flashtrain.collectives import gather_objects, is_main_process
from flashtrain.file_integrity import fsync_directory
from flashtrain.no_space import NoSpaceError, free_space, no_space_errno, shortage

log = logging.getLogger("flashtrain.checkpoint")


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


class LatestNotUpdated(Exception):
    """The checkpoint is complete and in place, but writing `latest` (which names it) failed."""

    def __init__(self, final: Path, error: OSError):
        super().__init__(
            f"checkpoint {final} is complete, but writing {final.parent / 'latest'} failed: {error}"
        )
        self.final = final


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any] | None,
    meta: dict[str, Any],
    config_yaml: str = "",
    sharded: bool = False,
    keep_last: int = 0,
) -> Path:
    """Write checkpoint `step` under `root`. A collective: every rank calls it.

    trainer_state (rank 0's; other ranks may pass None) holds whatever the trainer needs beyond
    model and optimizer. sharded=True writes through torch.distributed.checkpoint (FSDP2).
    Every file is hashed while it is written (each rank hashes its own shards); meta.json,
    written last, lists them all. Returns the final checkpoint directory.

    Rank 0 holds the folder's lock meanwhile (a trainer holds it for its whole run; a caller
    without it takes it here), so nothing it clears away is another live run's. A failure on
    any rank fails the save on every rank and removes the partial checkpoint; a full disk or a
    spent quota raises NoSpaceError. (The same steps with the write on a background thread: async_write.py.)
    """
    opened = begin_save(root, step)

    def write_state() -> Manifest:
        return write_model_optim(opened.tmp, model_optim_state(model, optimizer, sharded), sharded)

    return complete_save(
        opened,
        write_state,
        trainer_state=trainer_state,
        meta=meta,
        config_yaml=config_yaml,
        sharded=sharded,
        keep_last=keep_last,
    )


@dataclass
class OpenSave:
    """A save under way, from begin_save to complete_save (or discard_save): its temporary
    folder, the name it gets once complete, and the folder's lock when this process did not hold
    it already (a tool, a test)."""

    root: Path
    tmp: Path
    final: Path
    hold: contextlib.ExitStack


def begin_save(root: str | os.PathLike, step: int) -> OpenSave:
    """A collective: rank 0 takes the folder's lock if it lacks it, clears away what an
    interrupted save or prune left, and makes the temporary folder; a failure on any rank is
    raised on every rank."""
    root = Path(root)
    name = checkpoint_name(step)
    opened = OpenSave(root, root / f".{name}.tmp", root / name, contextlib.ExitStack())
    try:
        on_every_rank(
            lambda: _start_save(root, step, opened.tmp, opened.hold) if is_main_process() else None,
            opened.tmp,
        )
    except BaseException:
        opened.hold.close()
        raise
    return opened


def model_optim_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool
) -> dict[str, Any] | None:
    """What this rank writes of the model and optimizer: its shards (sharded), or the whole
    state on rank 0 and None on the others (one file, written by rank 0)."""
    if not (sharded or is_main_process()):
        return None
    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }


def write_model_optim(tmp: Path, state: dict[str, Any] | None, sharded: bool) -> Manifest:
    """Write model_optim_state's `state` into the temporary folder, hashing it as it is written
    (sharded: a collective through torch.distributed.checkpoint); this rank's manifest entries."""
    if sharded:
        import torch.distributed.checkpoint as dcp

        writer = HashingStorageWriter(tmp)
        dcp.save(state, storage_writer=writer)
        return writer.entries
    if state is None:
        return {}
    return {MODEL_OPTIM: write_hashed(tmp / MODEL_OPTIM, lambda f: torch.save(state, f))}


def complete_save(
    opened: OpenSave,
    written: Callable[[], Manifest],
    *,
    trainer_state: dict[str, Any] | None,
    meta: dict[str, Any],
    config_yaml: str,
    sharded: bool,
    keep_last: int,
) -> Path:
    """A collective: every rank's written() (its part written: its files' manifest entries),
    then rank 0 writes the trainer state, config and meta.json, renames the folder into place,
    moves `latest` and prunes to keep_last. A failure on any rank is raised on every rank and
    the partial folder removed; the lock begin_save took is released either way. Returns the
    final checkpoint directory."""
    tmp = opened.tmp
    try:  # from here on, tmp is this save's own
        every_rank = on_every_rank(written, tmp)

        def finish() -> None:
            if not is_main_process():
                return
            files = {file: entry for part in every_rank for file, entry in part.items()}
            _finish_save(
                opened.root, tmp, opened.final, files, trainer_state, meta, config_yaml, sharded
            )
            if keep_last > 0:
                prune_checkpoints(opened.root, keep_last)

        on_every_rank(finish, tmp)
    except BaseException:
        if is_main_process():  # every rank has stopped writing into it
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        opened.hold.close()
    return opened.final


def discard_save(opened: OpenSave) -> None:
    """Give up a save without finishing it (not a collective; call it once this rank has
    stopped writing into the folder): rank 0 removes the partial folder, the lock is released."""
    try:
        if is_main_process():
            shutil.rmtree(opened.tmp, ignore_errors=True)
    finally:
        opened.hold.close()


def _start_save(root: Path, step: int, tmp: Path, hold: contextlib.ExitStack) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if not holds_lock(root):  # called outside a run (a tool, a test): hold it for this save
        hold.enter_context(RunLock(root, f"save_checkpoint in pid {os.getpid()}"))
    # what a kill left cleared; newer checkpoints (a save of an older step) moved aside, so
    # the prune after this save never takes them for the newest
    set_aside_newer_checkpoints(root, step)
    tmp.mkdir()


def _finish_save(root, tmp, final, files, trainer_state, meta, config_yaml, sharded) -> None:
    """Rank 0, all shards written: the trainer state, config and meta.json, then the rename."""
    files[TRAINER_STATE] = write_hashed(
        tmp / TRAINER_STATE, lambda f: torch.save(trainer_state or {}, f)
    )
    if config_yaml:
        files[CONFIG] = write_hashed(tmp / CONFIG, lambda f: f.write(config_yaml.encode()))
    full_meta = dict(meta)
    full_meta.update(
        step=int(checkpoint_step(final)),
        format="dcp" if sharded else "torch",
        version=FORMAT_VERSION,
        files=complete_manifest(tmp, files),
    )
    with open(tmp / META, "w") as f:
        json.dump(full_meta, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(tmp)
    if final.exists():  # the same step saved again (a resume from an older step): swap it in
        try:
            old_meta = read_meta(final)
            was = f"written {old_meta.get('time', '?')} by run '{old_meta.get('run_name', '?')}'"
        except CheckpointError:
            was = "incomplete"
        log.warning("replacing checkpoint %s (%s) with this run's step", final, was)
        old = root / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_directory(root)
    try:
        _atomic_write_text(root / "latest", final.name + "\n")
    except OSError as e:
        raise LatestNotUpdated(final, e) from e


def on_every_rank(work: Callable[[], Any], tmp: Path) -> list:
    """Run `work` on every rank, then tell every rank whether any failed (a collective, so no
    rank waits forever for one that failed): each rank's work() value, or the failure raised on
    every rank (a full disk or quota as NoSpaceError)."""
    failure = value = None
    try:
        value = work()
    except Exception as e:  # noqa: BLE001 - passed on to the other ranks, then raised
        failure = e
    outcome = ("failed", _describe_failure(failure, tmp)) if failure else ("ok", value)
    outcomes = gather_objects(outcome)
    if failure is not None:
        if no_space_errno(failure) is not None:
            raise NoSpaceError(_describe_failure(failure, tmp)[1]) from failure
        raise failure
    for rank, (status, value) in enumerate(outcomes):
        if status == "failed":
            kind, message = value
            if kind == "no_space":
                raise NoSpaceError(message)
            raise RuntimeError(f"saving a checkpoint failed on rank {rank}: {message}")
    return [value for _, value in outcomes]


def _describe_failure(error: BaseException | None, tmp: Path) -> tuple[str, str]:
    """("no_space", the line) for a full disk or a spent quota (flashtrain/no_space.py: in
    whatever torch.save or DCP wrapped it), else ("other", the error)."""
    code = no_space_errno(error)
    if isinstance(error, LatestNotUpdated) and code is not None:
        return "no_space", (
            f"{shortage(code)} writing {error.final.parent / 'latest'}: checkpoint "
            f"{error.final} is complete and kept (trainer.resume=auto finds it), only `latest` "
            f"still names the one before; {free_space(code, error.final.parent)} (or lower "
            f"trainer.keep_last), then continue with trainer.resume=auto"
        )
    if code is not None:
        final = tmp.parent / tmp.name[1 : -len(".tmp")]
        return "no_space", (
            f"{shortage(code)} writing checkpoint {final}: the partial "
            f"checkpoint was removed, the earlier ones are intact; {free_space(code, tmp.parent)} "
            f"(or lower trainer.keep_last), then continue with trainer.resume=auto"
        )
    return "other", f"{type(error).__name__}: {error}"


def _remove_leftovers(root: Path) -> None:
    """What an interrupted save or prune left: temporary directories, and step directories
    without a meta.json (a prune cut short). A checkpoint moved aside to be replaced by a new
    save of the same step goes back into place if the new one never arrived."""
    for old in root.glob(".step_*.old"):
        final = root / old.name[1 : -len(".old")]
        if not final.exists() and (old / META).is_file():
            os.rename(old, final)
        else:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".step_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    for entry in root.iterdir():
        if CKPT_RE.match(entry.name) and entry.is_dir() and not (entry / META).exists():
            shutil.rmtree(entry, ignore_errors=True)


def prune_checkpoints(root: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints under `root`. Each loses its meta.json
    first (made durable before anything else goes), so a prune cut short at any moment leaves
    only complete checkpoints and directories that are plainly not checkpoints (removed by the
    next save)."""
    doomed = find_checkpoints(root)[:-keep_last] if keep_last > 0 else []
    for info in doomed:
        (info.path / META).unlink(missing_ok=True)
        fsync_directory(info.path)
    for info in doomed:
        shutil.rmtree(info.path, ignore_errors=True)


ABANDONED = "abandoned"  # in a checkpoint folder: the lines of checkpoints a branch left


def set_aside_newer_checkpoints(root: str | os.PathLike, step: int) -> list[Path]:
    """The branch rule (docs/training.md, "Branching from an older checkpoint"): a run that
    continues from step `step` owns the folder's line from there, so every checkpoint in `root`
    newer than `step`, intact or not, is moved into abandoned/<when>/ inside it, kept whole and
    named in a warning. find_checkpoints reads the folder's top level only, so neither a prune
    nor any "newest" lookup (trainer.resume=auto, a job's restart, export, generate) ever takes
    one of them for the run's; `latest` then names the newest checkpoint left. What an
    interrupted save or prune left is cleared first (a checkpoint moved aside to be replaced
    goes back into place, and is then set aside with the others if newer). Rank 0, holding the
    folder's lock. Returns where each went."""
    root = Path(root)
    if not root.is_dir():
        return []
    _remove_leftovers(root)
    newer = sorted(
        (info.path for info in find_checkpoints(root) if info.step > step), key=checkpoint_step
    )
    if not newer:
        return []
    aside = _new_abandoned_folder(root)
    moved = []
    for folder in newer:  # renames within the folder: each checkpoint moves whole or not at all
        os.rename(folder, aside / folder.name)
        moved.append(aside / folder.name)
    fsync_directory(aside)
    fsync_directory(root)
    kept = find_checkpoints(root)
    if kept:
        _atomic_write_text(root / "latest", kept[-1].path.name + "\n")
    else:
        (root / "latest").unlink(missing_ok=True)
    log.warning(
        "checkpoint folder %s: the run goes on from step %d, so its newer checkpoint(s) %s "
        "(a line this run does not continue) were moved to %s, kept whole; no resume, prune, "
        "export or generate takes them from there unless named (delete it once not needed)",
        root, step, ", ".join(p.name for p in moved), aside,
    )  # fmt: skip
    return moved


def _new_abandoned_folder(root: Path) -> Path:
    """abandoned/<date>_<time>/ (a -2, -3 ... suffix when two branches share the second)."""
    when = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    parent = root / ABANDONED
    parent.mkdir(exist_ok=True)
    folder, n = parent / when, 1
    while True:
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1
            folder = parent / f"{when}-{n}"
