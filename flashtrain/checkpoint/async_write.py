"""Checkpoints written in the background (trainer.async_checkpoint=true): training goes on while
the files are written; the guarantees of write.py hold as for a synchronous save.

One design for both formats, in three parts:

1. Start (the training thread, at the step that saves; a collective). The save still in flight
   is finished first: at most one is in flight, so two staged copies never share the memory and
   `latest` moves in step order. The temporary folder is made (write.begin_save). Each rank
   stages a CPU copy of its part of the model and optimizer state (DCP's BlockingAsyncStager:
   the step's whole stall is this memory copy), and every rank learns whether any failed
   before anything is written in the background.
2. Write (a background thread), hashing every file as it is written: the sharded format
   ("dcp", FSDP2) through torch.distributed.checkpoint.async_save with the HashingStorageWriter
   (each rank writes and hashes its own shards; the copy staged above is passed through), the
   single-file format ("torch", single process and DDP) by rank 0 alone, with torch.save
   through the hashing writer (write.write_model_optim, as a synchronous save writes it).
3. Finish (the training thread; a collective): write.complete_save, the synchronous save's own
   last step. Once every rank's part is written, rank 0 writes the trainer state, config and
   meta.json with every rank's checksums, renames the folder into place and moves `latest`,
   then prunes to keep_last. A failure on any rank in the background (a full disk) is raised
   here on every rank, with the messages of a synchronous save (NoSpaceError: exit 4), and the
   partial folder is removed.

How the ranks agree that every part is written: at each step boundary while a save is in
flight (poll), one all-reduce of each rank's done flag. So the checkpoint goes into place, and a
background failure is raised, one step after the last rank finished writing; finishing only at
the next save would leave `latest` an interval behind (what a kill meanwhile loses) and report a
full disk an interval late. The cost is one CPU all-reduce of one number a step while a save is
in flight, nothing otherwise. The end of a run and a pre-emption wait for the save in flight
instead (wait). An error path (close) finishes nothing: it waits until this rank's writer has
stopped, then removes the partial folder, so no writer runs on into a deleted folder.

Collectives off the training thread run on gloo groups of their own, made at the first save:
async_save needs a CPU-capable group (under NCCL the default one is not), and a group shared
with the training thread's collectives could pair the two threads' calls differently on
different ranks. The done flags have a gloo group of their own for the same reason (DCP's
background collectives run meanwhile). A single process without a group needs neither.

A kill (SIGKILL, a node lost) during a background write leaves the previous checkpoint the
newest intact one: the temporary folder `.step_N.tmp` is never taken for a checkpoint
(trainer.resume=auto finds the previous one) and the next save clears it away.
"""

from __future__ import annotations

import concurrent.futures
import copy
import datetime
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import AsyncStager, BlockingAsyncStager

from flashtrain.checkpoint.manifest import HashingStorageWriter
from flashtrain.checkpoint.write import (
    OpenSave,
    begin_save,
    complete_save,
    discard_save,
    model_optim_state,
    on_every_rank,
    write_model_optim,
)
from flashtrain.collectives import is_main_process

log = logging.getLogger("flashtrain.checkpoint")


class _AlreadyStaged(AsyncStager):
    """async_save's stager for a state dict this module staged already (both formats alike,
    every rank agreeing it staged before DCP's background collectives start)."""

    _synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict


@dataclass
class _InFlight:
    """The save being written in the background: its folder, this rank's writer (its result:
    this rank's manifest entries) and what finishing it writes besides."""

    opened: OpenSave
    writer: concurrent.futures.Future
    finish: dict[str, Any]
    started: float  # time.perf_counter() when the background write began


class BackgroundSaves:
    """A run's checkpoints written in the background, one in flight at most (the module
    docstring). start, poll and wait are collectives (every rank calls them at the same steps);
    close is not. `newest`: the newest checkpoint these saves put into place.

    timeout: of the gloo groups this makes (the run's trainer.dist_timeout_s)."""

    def __init__(self, timeout: datetime.timedelta | None = None) -> None:
        self.timeout = timeout
        self.newest: Path | None = None
        self._in_flight: _InFlight | None = None
        self._groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None

    @property
    def in_flight(self) -> Path | None:
        """The checkpoint being written (the folder it gets once complete), or None."""
        return self._in_flight.opened.final if self._in_flight else None

    def start(
        self,
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
        """Stage checkpoint `step` and write it in the background (save_checkpoint's arguments).
        Waits for the save in flight first. Returns the folder the checkpoint gets once
        complete; until then `latest` and the checkpoints under root are the earlier ones."""
        self.wait()
        stall = time.perf_counter()
        if dist.is_initialized() and self._groups is None:  # every rank makes them, in order
            self._groups = (
                dist.new_group(backend="gloo", timeout=self.timeout),  # the done flags
                dist.new_group(backend="gloo", timeout=self.timeout),  # DCP's, in its thread
            )
        opened = begin_save(root, step)
        try:
            # the trainer state is written when the save finishes: a copy of it as it is now
            finish = dict(
                trainer_state=copy.deepcopy(trainer_state),
                meta=dict(meta),
                config_yaml=config_yaml,
                sharded=sharded,
                keep_last=keep_last,
            )
            staged = {}  # this rank's copy; every rank learns whether any failed to make one

            def stage() -> None:
                staged["state"] = _staged(model, optimizer, sharded)

            on_every_rank(stage, opened.tmp)
            writer = self._write_in_background(opened.tmp, staged["state"], sharded)
        except BaseException:
            discard_save(opened)  # nothing writes into it yet
            raise
        now = time.perf_counter()
        self._in_flight = _InFlight(opened, writer, finish, started=now)
        log.info(
            "checkpoint: writing %s in the background (training paused %.2f s for the copy)",
            opened.final,
            now - stall,
        )
        return opened.final

    def poll(self) -> Path | None:
        """At a step boundary: the save in flight put into place when every rank has written its
        part (its folder then), else None. A collective while a save is in flight."""
        if self._in_flight is None:
            return None
        if not self._on_all_ranks(self._in_flight.writer.done()):
            return None
        return self._complete()

    def wait(self) -> Path | None:
        """The save in flight written on every rank and put into place (its folder), or None
        when there was none. A collective while a save is in flight."""
        if self._in_flight is None:
            return None
        return self._complete()

    def close(self) -> None:
        """Give up the save in flight without finishing it (an error path; not a collective):
        wait until this rank's writer has stopped, then rank 0 removes the partial folder."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        concurrent.futures.wait([flight.writer])
        discard_save(flight.opened)
        if is_main_process():
            log.warning(
                "checkpoint %s was being written in the background when the run stopped: its "
                "partial folder was removed (the earlier checkpoints are intact)",
                flight.opened.final,
            )

    def _complete(self) -> Path:
        flight, self._in_flight = self._in_flight, None
        path = complete_save(flight.opened, flight.writer.result, **flight.finish)
        self.newest = path
        log.info(
            "checkpoint: %s (written in the background, %.1f s)",
            path,
            time.perf_counter() - flight.started,
        )
        return path

    def _write_in_background(
        self, tmp: Path, staged: dict | None, sharded: bool
    ) -> concurrent.futures.Future:
        """This rank's part written and hashed on a background thread; the future's result is
        its manifest entries."""
        if sharded:
            import torch.distributed.checkpoint as dcp

            storage = HashingStorageWriter(tmp)
            saved = dcp.async_save(
                staged,
                storage_writer=storage,
                async_stager=_AlreadyStaged(),
                process_group=self._groups[1] if self._groups else None,
            )
            return _then(saved, lambda _: storage.entries)
        executor = concurrent.futures.ThreadPoolExecutor(1, "flashtrain-checkpoint")
        try:
            return executor.submit(write_model_optim, tmp, staged, False)
        finally:
            executor.shutdown(wait=False)  # its thread ends with the write

    def _on_all_ranks(self, done: bool) -> bool:
        """Whether `done` holds on every rank (a collective with a process group)."""
        if not dist.is_initialized():
            return done
        flag = torch.tensor([int(done)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._groups[0])
        return bool(flag.item())


def _staged(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool):
    """A CPU copy of this rank's part of the state (model_optim_state), which training may no
    longer change; None on a rank that writes nothing."""
    state = model_optim_state(model, optimizer, sharded)
    return None if state is None else BlockingAsyncStager().stage(state)


def _then(future: concurrent.futures.Future, result) -> concurrent.futures.Future:
    """A future that completes with result(future's value) once `future` has, or with its
    failure."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        if f.exception() is not None:
            out.set_exception(f.exception())
        else:
            out.set_result(result(f.result()))

    future.add_done_callback(done)
    return out
