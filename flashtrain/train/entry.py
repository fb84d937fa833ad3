"""train.py's entry point: run the Trainer, and turn expected failures into a message and an
exit code a scheduler can act on."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from flashtrain.train import checkpoint as ckpt
from flashtrain.train.config import ConfigError
from flashtrain.train.faults import NonFiniteLossError, Preempted
from flashtrain.train.trainer import Trainer, ensure_logging, log

EXIT_CONFIG = 2
EXIT_NONFINITE = 3
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a terminated job


def main(cfg: DictConfig) -> None:
    """Entry point for train.py: run, and turn expected failures into a message and exit code."""
    try:
        run(cfg)
    except (ConfigError, ckpt.CheckpointError, OmegaConfBaseException) as e:
        _report_error(f"{type(e).__name__}: {e}")
        raise SystemExit(EXIT_CONFIG) from None
    except NonFiniteLossError as e:
        _report_error(str(e))
        raise SystemExit(EXIT_NONFINITE) from None
    except Preempted as e:
        log.warning("%s", e)
        raise SystemExit(EXIT_PREEMPTED) from None


def _report_error(msg: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        ensure_logging()
        log.error("%s", msg)


def run(cfg: DictConfig, run_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Train as `cfg` says. Returns a summary: steps done, last losses, evals, checkpoint.

    run_dir: where outputs go; default Hydra's run directory (under train.py) or
    outputs/<date>/<time>. Under torchrun, rank 0's choice is used by every rank.
    """
    trainer = Trainer(cfg, run_dir=run_dir)
    ok = False
    try:
        summary = trainer.fit()
        ok = True
        return summary
    finally:
        trainer.close(clean=ok)
