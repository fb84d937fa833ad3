"""Faults: non-finite losses, preemption (SIGTERM), CUDA out-of-memory."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import torch

from flashtrain.train.distributed import is_sharded

log = logging.getLogger("flashtrain")


class NonFiniteLossError(RuntimeError):
    """The loss (or gradient norm) became NaN/inf; the run stops, keeping its checkpoints."""

    def __init__(self, step: int, loss: float, grad_norm: float | None, last_ckpt: str | None):
        self.step = step
        where = f"the last good checkpoint is {last_ckpt}" if last_ckpt else "no checkpoint yet"
        super().__init__(
            f"non-finite loss at step {step} (loss={loss}, grad_norm={grad_norm}); "
            f"stopping without saving ({where}). Lower optim.lr, raise optim.warmup_steps, "
            f"check trainer.precision, or pass trainer.on_nonfinite=skip to drop such updates."
        )


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written and the run stopped early."""

    def __init__(self, step: int, ckpt: str | None):
        self.step = step
        self.ckpt = ckpt
        super().__init__(
            f"stopped by SIGTERM after step {step}; checkpoint {ckpt}. "
            f"Continue with trainer.resume=auto (same run dir) or trainer.resume={ckpt}"
        )


class EvaluationAbandoned(Exception):
    """A stop request (SIGTERM) arrived during an evaluation, which every rank left at the same
    batch: the run checkpoints its step and stops instead (a scheduler's grace period is
    seconds; an evaluation can take minutes)."""

    def __init__(self, batches_done: int):
        self.batches_done = batches_done
        super().__init__(f"evaluation abandoned after {batches_done} batches: asked to stop")


class PreemptionHandler:
    """Turns SIGTERM (and SIGUSR1, which SLURM sends before the time limit when asked) into a
    flag the loop checks after each step, so a checkpoint is written at a step boundary; an
    evaluation checks it before each of its batches (EvaluationAbandoned)."""

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        if not self.requested:
            log.warning(
                "received signal %d: checkpointing at the end of this step (an evaluation "
                "under way is abandoned)",
                signum,
            )
        self.requested = True
        self.signum = signum

    def install(self) -> PreemptionHandler:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous = {}

    def __enter__(self) -> PreemptionHandler:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the host's: Python's MemoryError, or torch's CPU allocator
    failing (a RuntimeError "DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def oom_advice(
    cfg: Any,
    device: torch.device,
    exc: BaseException | None = None,
    micro_batch_size: int | None = None,
) -> str:
    """What to print on out-of-memory: the allocator summary (CUDA) and overrides that help.
    micro_batch_size: the one the run used (micro_batch_size=auto's choice); default the config's."""
    what = "CUDA out of memory" if device.type == "cuda" else "out of host memory"
    lines = [what + (f": {str(exc).splitlines()[0]}" if exc else "")]
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            lines.append(torch.cuda.memory_summary(device, abbreviated=True))
        except Exception:  # noqa: BLE001 - the summary is best effort
            pass
    mbs = micro_batch_size or cfg.micro_batch_size
    mbs = mbs if isinstance(mbs, int) else 1  # auto, never sized: no halving to offer
    hints = []
    if cfg.model.recompute not in ("all", "offload"):
        hints.append("model.recompute=all  (recompute each block in backward)")
    elif cfg.model.recompute == "all" and device.type == "cuda":
        hints.append(
            "model.recompute=offload  (each block's input in host memory until its backward)"
        )
    if getattr(cfg.model, "tile_tokens", None) == 0 and cfg.model.dropout == 0:
        hints.append("model.tile_tokens=16384  (the MLP over tiles of the sequence)")
    if mbs > 1:
        hints.append(
            f"micro_batch_size={max(1, mbs // 2)}  (gradient accumulation keeps the global batch)"
        )
    if not is_sharded(cfg.trainer.strategy) and device.type == "cuda":  # ranks on a host share it
        hints.append("trainer.strategy=fsdp  (shard parameters, gradients and optimizer state)")
    if cfg.trainer.precision in ("fp32",):
        hints.append("trainer.precision=bf16")
    hints.append(f"seq_len={max(1, cfg.seq_len // 2)}  (shorter context)")
    lines.append("To use less memory, try one of:")
    lines.extend(f"  {h}" for h in hints)
    return "\n".join(lines)
