"""The next optimizer steps' micro-batches, prepared on a background thread while the device
computes the current one.

A thread draws each step's `grad_accum` micro-batches from the data module's training stream,
counts their targets on the host, pins them (CUDA: the copies to the device then run without
blocking) and records the stream position after them; a bounded queue holds at most `depth`
steps. The position travels with the batches, so a checkpoint saves the position of the batches
the loop CONSUMED, never of the ones prefetched ahead: resuming replays exactly the same batches.

Errors in the thread reach the loop with their own type (a corrupt cache stays a user error);
close() stops the thread (also after an exception or SIGTERM). depth 0 prepares each step in the
loop itself, without a thread.
"""

from __future__ import annotations

import copy
import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function

from flashtrain.data.module import IGNORE_INDEX

_POLL_S = 0.1  # how often a blocked put / get looks up from waiting (stop requests, a dead thread)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A batch's tensors on `device` (non-blocking: pinned on CUDA by the prefetcher); other
    values (max_seqlen) as they are."""
    with record_function("flashtrain::data"):
        return {
            k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()
        }


def count_targets(batch: dict[str, Any]) -> int:
    """Targets a batch contributes to the loss: labels other than IGNORE_INDEX (on the host)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def pin(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's tensors in page-locked memory (other values, e.g. max_seqlen, as they are)."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@dataclass
class StepBatches:
    """One optimizer step's input on this rank."""

    batches: list[dict[str, Any]]  # grad_accum micro-batches of CPU tensors (pinned on CUDA)
    targets: list[int]  # targets per micro-batch, counted on the host
    data_state: dict  # the training stream's position after these batches


@dataclass
class _Failure:
    error: BaseException


class StepPrefetcher:
    """next() -> StepBatches of the next step; close() when done.

    data: a DataModule whose train_batches() only this object advances from now on (its
    val_batches() may still be used by the loop: they do not share the stream position).
    """

    def __init__(self, data, grad_accum: int, *, depth: int, pin_memory: bool):
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.data, self.grad_accum, self.pin_memory = data, grad_accum, pin_memory
        self._batches = iter(data.train_batches())
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(
                target=self._produce_until_stopped, name="flashtrain-prefetch", daemon=True
            )
            self._thread.start()

    def _produce(self) -> StepBatches:
        batches = [next(self._batches) for _ in range(self.grad_accum)]
        targets = [count_targets(b) for b in batches]
        if self.pin_memory:
            batches = [pin(b) for b in batches]
        return StepBatches(batches, targets, copy.deepcopy(self.data.state_dict()))

    def _produce_until_stopped(self) -> None:
        try:
            while not self._stop.is_set():
                self._put(self._produce())
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
            self._put(_Failure(e))

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def next(self) -> StepBatches:
        if self._thread is None:
            return self._produce()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the data prefetch thread ended without a batch") from None
                continue
            if isinstance(item, _Failure):
                raise item.error
            return item

    def close(self) -> None:
        """Stop the thread and drop what it prepared (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            while True:  # unblock a put that waits for room
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=10.0)
            self._thread = None
