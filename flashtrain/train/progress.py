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

from flashtrain.train.metric_names import (
    MAX_RESERVED_GIB,
    MAX_RSS_GIB,
    MFU,
    STEP_TIME_S,
    TOKENS_PER_S,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
    TRAIN_LR,
)
from flashtrain.train.metrics import format_duration
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
    """What a progress line's train/loss is: the mean over the interval's updates."""
    return "(last step)" if steps == 1 else f"(mean of {steps} steps)"


def format_metrics(metrics: dict[str, float]) -> str:
    """`name value` pairs for one-off lines (evaluation, the end of a run)."""
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())


# (metric name, formatter) in the order a progress line shows them after train/loss. The name
# printed is the name in metrics.jsonl, wandb and TensorBoard (metric_names.py).
LINE_FIELDS = (
    (TRAIN_LR, lambda x: f"{x:.3e}"),
    (TRAIN_GRAD_NORM, lambda x: f"{x:.3f}"),
    (TOKENS_PER_S, lambda x: format_count(x)),
    (MFU, lambda x: f"{x:.2f}%"),
    (STEP_TIME_S, lambda x: f"{x:.3f}s"),
    (MAX_RESERVED_GIB, lambda x: f"{x:.2f}"),  # CUDA
    (MAX_RSS_GIB, lambda x: f"{x:.2f}"),  # CPU
)


def format_line(
    step: int, max_steps: int, metrics: dict[str, Any], eta: float | None, loss_steps: int = 1
) -> str:
    """`step 100/400 | train/loss 2.3100 (mean of 5 steps) | train/lr 3.000e-03 | ... | eta 0:27`.
    loss_steps: how many updates metrics[train/loss] averages (the line says so)."""
    width = len(str(max_steps))
    parts = [f"step {step:>{width}}/{max_steps}"]
    if TRAIN_LOSS in metrics:
        parts.append(f"{TRAIN_LOSS} {metrics[TRAIN_LOSS]:.4f} {loss_label(loss_steps)}")
    parts += [f"{key} {fmt(metrics[key])}" for key, fmt in LINE_FIELDS if key in metrics]
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
            post = {}  # the log line's names and numbers, fewer of them
            if TRAIN_LOSS in metrics:  # the interval's mean, as in the log line
                post[TRAIN_LOSS] = f"{metrics[TRAIN_LOSS]:.4f}"
            if TRAIN_LR in metrics:
                post[TRAIN_LR] = f"{metrics[TRAIN_LR]:.2e}"
            if TOKENS_PER_S in metrics:
                post[TOKENS_PER_S] = format_count(metrics[TOKENS_PER_S])
            if MFU in metrics:
                post[MFU] = f"{metrics[MFU]:.1f}%"
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
