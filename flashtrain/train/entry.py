"""train.py's entry point: Hydra's run directory and group choices in, the Trainer run, and
expected failures turned into a message and an exit code a scheduler can act on.

Exit codes (docs/training.md): 0 done; 2 a user error (flashtrain/train/errors.py: one message,
the traceback only with HYDRA_FULL_ERROR=1); 3 a non-finite loss; 4 no space left on the device
while saving a checkpoint (the partial one removed); 130 interrupted (Ctrl-C: no checkpoint
written); 143 pre-empted (SIGTERM: checkpoint written); 1 a crash (a traceback, as Hydra prints
it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from flashtrain.checkpoint.manifest import NoSpaceError
from flashtrain.train.errors import USER_ERRORS, describe
from flashtrain.train.faults import NonFiniteLossError, Preempted
from flashtrain.train.trainer import Trainer, ensure_logging, log
from flashtrain.typed_config import describe_unknown_key

EXIT_USER_ERROR = 2
EXIT_NONFINITE = 3
EXIT_NO_SPACE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a terminated job

FULL_ERROR = "HYDRA_FULL_ERROR"
_full_error_set_here = False  # config_errors_explained set HYDRA_FULL_ERROR, not the user


def main(cfg: Any) -> None:
    """Entry point for train.py: run, and turn expected failures into a message and exit code."""
    _give_hydra_error_reporting_back()
    try:
        run(with_command_line_settings(cfg))
    except USER_ERRORS as e:
        _report_user_error(e)
        raise SystemExit(EXIT_USER_ERROR) from None
    except NonFiniteLossError as e:
        _report_user_error(e)
        raise SystemExit(EXIT_NONFINITE) from None
    except NoSpaceError as e:
        _report_user_error(e)
        raise SystemExit(EXIT_NO_SPACE) from None
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":
            ensure_logging()
            log.warning(
                "interrupted (Ctrl-C): no checkpoint written by the interrupt; the newest one "
                "continues with trainer.resume=auto, exit %d",
                EXIT_INTERRUPTED,
            )
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Preempted as e:
        _report_preempted(e)
        raise SystemExit(EXIT_PREEMPTED) from None


def with_command_line_settings(cfg: Any) -> Any:
    """The composed config (a DictConfig) with the data settings of a program whose top level
    is guarded (flashtrain.data.registry.command_line_settings: e.g. Pathfinder's generator on
    all cores when data.num_workers is null). A bad config raises what the Trainer would."""
    from omegaconf import OmegaConf

    from flashtrain.data.registry import command_line_settings
    from flashtrain.train.config import validate_config

    for key, value in command_line_settings(validate_config(cfg).data).items():
        OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    return cfg


def _wants_traceback() -> bool:
    return os.environ.get(FULL_ERROR) == "1"


def _report_user_error(error: BaseException) -> None:
    if os.environ.get("RANK", "0") == "0":
        ensure_logging()
        log.error("%s", describe(error), exc_info=error if _wants_traceback() else None)


def _report_preempted(error: Preempted) -> None:
    """Every rank says how it ended: under torchrun the launcher's own exit code is 1 whatever
    its ranks returned, so these lines are how a pre-emption is told from a failure."""
    ensure_logging()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = f"rank {os.environ.get('RANK', '0')}/{world}: " if world > 1 else ""
    # Rank 0 logs at INFO and the others at WARNING (Trainer): WARNING reaches every rank's log.
    log.warning(
        "%spre-empted at step %d, checkpoint %s written, exit %d",
        rank,
        error.step,
        error.ckpt,
        EXIT_PREEMPTED,
    )
    if os.environ.get("RANK", "0") == "0":  # how to continue, once
        log.warning("%s", error)


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


def _give_hydra_error_reporting_back() -> None:
    """config_errors_explained sets HYDRA_FULL_ERROR=1 so that errors while Hydra composes reach
    it; from the task function on, the user's setting holds again, so a crash gets Hydra's own
    report (a traceback, and the full one only when the user set HYDRA_FULL_ERROR=1)."""
    global _full_error_set_here
    if _full_error_set_here:
        os.environ.pop(FULL_ERROR, None)
        _full_error_set_here = False


@contextlib.contextmanager
def config_errors_explained():
    """Around a @hydra.main function: a config that fails while Hydra composes it (a misspelled
    key in a YAML file or an override, an unknown group option) exits with code 2 and Hydra's
    message plus the allowed keys; with HYDRA_FULL_ERROR=1 (the user's) the traceback first.

    Hydra reports such errors itself (exit 1) unless HYDRA_FULL_ERROR=1, which this sets while
    composing when the user has not; main() unsets it again before the run starts."""
    global _full_error_set_here
    _full_error_set_here = FULL_ERROR not in os.environ
    user_wants_traceback = _wants_traceback()
    if _full_error_set_here:
        os.environ[FULL_ERROR] = "1"
    try:
        yield
    except USER_ERRORS as e:
        if user_wants_traceback:
            traceback.print_exception(e)
        lines = [str(e)]
        if e.__cause__ is not None and isinstance(e.__cause__, USER_ERRORS):
            lines.append(str(e.__cause__))
        hint = describe_unknown_key(e)
        if hint:
            lines.append(hint)
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
    finally:
        _give_hydra_error_reporting_back()
