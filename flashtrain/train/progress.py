"""Progress output on rank 0: a tqdm bar with ETA on a terminal, plain lines in logs.

`trainer.progress=auto` picks the bar when stderr is a terminal and plain lines otherwise (a log
file, a cluster job, a pipe). Interval lines always reach the log file Hydra writes (train.log);
with the bar they are kept off the terminal, where the bar's postfix shows the same numbers.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from flashtrain.train.metrics import format_duration, peak_memory_gib
from flashtrain.utils import format_count

log = logging.getLogger("flashtrain")

PROGRESS_ATTR = "flashtrain_progress_line"


class _DropProgressLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, PROGRESS_ATTR, False)


def _console_handlers() -> list[logging.Handler]:
    out = []
    for logger in (logging.getLogger(), log):
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                out.append(h)
    return out


def _terminal_columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def loss_label(steps: int) -> str:
    """What a progress line's loss is: metrics' `loss` is the mean over the interval's updates."""
    return "train/loss (last step)" if steps == 1 else f"train/loss (mean of last {steps} steps)"


def format_metrics(metrics: dict[str, float]) -> str:
    """`name value` pairs for one-off lines (evaluation, the end of a run)."""
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())


# (metric key, label, formatter) in the order a progress line shows them after the loss.
LINE_FIELDS = (
    ("lr", "lr", lambda x: f"{x:.3e}"),
    ("grad_norm", "grad_norm", lambda x: f"{x:.3f}"),
    ("tokens_per_s", "tokens/s", lambda x: format_count(x)),
    ("mfu", "mfu", lambda x: f"{x:.2f}%"),
    ("step_time_s", "step_time", lambda x: f"{x:.3f}s"),
)


def format_line(
    step: int, max_steps: int, metrics: dict[str, Any], eta: float | None, loss_steps: int = 1
) -> str:
    """loss_steps: how many updates metrics["loss"] averages (it is named accordingly)."""
    width = len(str(max_steps))
    parts = [f"step {step:>{width}}/{max_steps}"]
    if "loss" in metrics:
        parts.append(f"{loss_label(loss_steps)} {metrics['loss']:.4f}")
    parts += [f"{label} {fmt(metrics[key])}" for key, label, fmt in LINE_FIELDS if key in metrics]
    mem = peak_memory_gib(metrics)
    if mem is not None:
        parts.append(f"mem {mem:.2f}GiB")
    parts.append(f"eta {format_duration(eta)}")
    return " | ".join(parts)


class Progress:
    def __init__(self, mode: str, *, total: int, initial: int, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", lambda: False)
            mode = "bar" if isatty() else "lines"
        self.mode = mode if enabled else "off"
        self.total = total
        self.bar = None
        self._redirect = None
        self._filtered: list[logging.Handler] = []
        self._filter = _DropProgressLines()
        if self.mode in ("bar", "none"):
            if self.mode == "bar":
                from tqdm.auto import tqdm
                from tqdm.contrib.logging import logging_redirect_tqdm

                loggers = [logging.getLogger()]
                if any(h in _console_handlers() for h in log.handlers):
                    loggers.append(log)
                self._redirect = logging_redirect_tqdm(loggers=loggers)
                self._redirect.__enter__()
                width = _terminal_columns(self.stream)
                self.bar = tqdm(
                    total=total,
                    initial=initial,
                    desc="train",
                    unit="step",
                    dynamic_ncols=width > 0,
                    ncols=None if width > 0 else 120,  # a pseudo-terminal of unknown size
                    file=self.stream,
                )
            for h in _console_handlers():
                h.addFilter(self._filter)
                self._filtered.append(h)

    def step(self, step: int) -> None:
        """Call once per finished optimizer step; `step` counts finished steps."""
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def interval(
        self, step: int, metrics: dict[str, Any], eta: float | None, loss_steps: int = 1
    ) -> str:
        """Report an interval's metrics: a log line (off the terminal while the bar runs)."""
        line = format_line(step, self.total, metrics, eta, loss_steps)
        if self.mode == "off":
            return line
        if self.bar is not None:
            post = {}
            if "loss" in metrics:  # the interval's mean, as in the log line
                post["loss_mean"] = f"{metrics['loss']:.4f}"
            if "lr" in metrics:
                post["lr"] = f"{metrics['lr']:.2e}"
            if "tokens_per_s" in metrics:
                post["tok/s"] = format_count(metrics["tokens_per_s"])
            if "mfu" in metrics:
                post["mfu"] = f"{metrics['mfu']:.1f}%"
            self.bar.set_postfix(post, refresh=True)
        log.info(line, extra={PROGRESS_ATTR: True})
        return line

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        for h in self._filtered:
            h.removeFilter(self._filter)
        self._filtered = []
