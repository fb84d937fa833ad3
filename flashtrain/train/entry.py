"""train.py's entry point: Hydra's run directory and group choices in, the Trainer run, and
expected failures turned into a message and an exit code a scheduler can act on."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf.errors import OmegaConfBaseException

from flashtrain.train import checkpoint as ckpt
from flashtrain.train.config import ConfigError
from flashtrain.train.faults import NonFiniteLossError, Preempted
from flashtrain.train.trainer import Trainer, ensure_logging, log
from flashtrain.typed_config import describe_unknown_key

EXIT_CONFIG = 2
EXIT_NONFINITE = 3
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a terminated job


def main(cfg: Any) -> None:
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


def run(cfg: Any, run_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Train as `cfg` says. Returns a summary: steps done, last losses, evals, checkpoint.

    run_dir: where outputs go; default Hydra's run directory (under train.py) or
    outputs/<date>/<time>. Under torchrun, rank 0's choice is used by every rank.
    """
    trainer = Trainer(cfg, run_dir or default_run_dir(), choices=hydra_choices())
    ok = False
    try:
        summary = trainer.fit()
        ok = True
        return summary
    finally:
        trainer.close(clean=ok)


# ---- Hydra ----------------------------------------------------------------------------------


def _hydra_config():
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def default_run_dir() -> Path:
    """Hydra's run directory under train.py, else outputs/<date>/<time>."""
    hydra = _hydra_config()
    if hydra is not None:
        return Path(hydra.runtime.output_dir)
    now = datetime.datetime.now()
    return Path("outputs") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")


def hydra_choices() -> dict[str, str]:
    """The group options Hydra composed (model=gpt2, experiment=owt/gpt2s-4k, ...), or {}."""
    hydra = _hydra_config()
    if hydra is None:
        return {}
    choices = hydra.runtime.choices
    return {k: str(v) for k, v in choices.items() if not k.startswith("hydra/")}


@contextlib.contextmanager
def config_errors_explained():
    """Around a @hydra.main function: a config that fails while Hydra composes it (a misspelled
    key in a YAML file or an override) exits with Hydra's message plus the allowed keys.

    Hydra reports such errors itself unless HYDRA_FULL_ERROR=1, which this sets (when unset) so
    that the error reaches here; any other exception propagates with its full traceback."""
    from hydra.errors import HydraException

    unset = "HYDRA_FULL_ERROR" not in os.environ
    if unset:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        lines = [str(e)]
        if isinstance(e.__cause__, OmegaConfBaseException):
            lines.append(str(e.__cause__))
        hint = describe_unknown_key(e)
        if hint:
            lines.append(hint)
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if unset:
            os.environ.pop("HYDRA_FULL_ERROR", None)
