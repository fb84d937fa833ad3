"""train.py's entry point: Hydra's run directory and group choices in, the Trainer run, and
expected failures turned into a message and an exit code a scheduler can act on.

Exit codes (docs/training.md): 0 done; 2 a user error (flashtrain/train/errors.py: one message,
the traceback only with HYDRA_FULL_ERROR=1); 3 a non-finite loss; 4 no space left on the device
or the disk quota exceeded (flashtrain/no_space.py: while saving a checkpoint, the partial one
removed; building a data cache; any other write); 130 interrupted (Ctrl-C: no checkpoint
written); 143 pre-empted (SIGTERM: checkpoint written); 1 a crash (a traceback, as Hydra prints
it).
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import logging
import os
import re
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from flashtrain.no_space import NoSpaceError, unnamed
from flashtrain.train.errors import USER_ERRORS, describe
from flashtrain.train.faults import (
    NonFiniteLossError,
    Preempted,
    is_out_of_memory,
    oom_advice,
)
from flashtrain.train.trainer import Trainer, ensure_logging, log
from flashtrain.typed_config import describe_unknown_key

EXIT_USER_ERROR = 2
EXIT_NONFINITE = 3
EXIT_NO_SPACE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a terminated job
AFTER_FREEING_SPACE = "then run again (trainer.resume=auto continues from the newest checkpoint)"

FULL_ERROR = "HYDRA_FULL_ERROR"
_full_error_set_here = False  # config_errors_explained set HYDRA_FULL_ERROR, not the user


def main(cfg: Any) -> None:
    """Entry point for train.py: run, and turn expected failures into a message and exit code."""
    _give_hydra_error_reporting_back()
    earlier_log = run_log_size()  # a rerun into the folder of an earlier run (its train.log)
    try:
        summary = run(with_command_line_settings(cfg))
        if summary.get("dry_run"):
            remove_unused_run_folder(earlier_log=earlier_log)
    except USER_ERRORS as e:
        _report_user_error(e)
        remove_unused_run_folder(earlier_log=earlier_log)
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
    except Exception as e:
        no_space = unnamed(e, AFTER_FREEING_SPACE)
        if no_space is not None:  # a write no writer named (a metrics row, a plot)
            _report_user_error(no_space)
            raise SystemExit(EXIT_NO_SPACE) from None
        _write_crash_to_log_files(e)
        raise  # Hydra prints the traceback on the console and exits 1


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
    except Exception as e:
        if is_out_of_memory(e):  # what would fit, before the traceback
            micro = trainer.plan.micro_batch_size
            log.error("%s", oom_advice(trainer.cfg, trainer.env.device, e, micro))
        raise
    finally:
        trainer.close(clean=ok)


# ---- what a run leaves behind ----------------------------------------------------------------

# What Hydra puts in a run folder before the run starts: its config copies and the log file.
RUN_LOG = "train.log"  # hydra.job_logging in configs/train.yaml: <job name>.log
HYDRA_FILES = frozenset({".hydra", RUN_LOG})
DATE_FOLDER = re.compile(r"\d{4}-\d{2}-\d{2}")  # outputs/<date>/<time>: configs/train.yaml


def run_log_size(run_dir: Path | None = None) -> int:
    """Bytes in the run folder's train.log (Hydra's run folder by default; 0 without one). At
    the start of main() nothing of this run's is in it yet: what is there an earlier run wrote
    (a crash's traceback, in a folder reused through hydra.run.dir)."""
    if run_dir is None:
        if _hydra_config() is None:
            return 0
        run_dir = Path(_hydra_config().runtime.output_dir)
    try:
        return (Path(run_dir) / RUN_LOG).stat().st_size
    except OSError:
        return 0


def remove_unused_run_folder(run_dir: Path | None = None, *, earlier_log: int = 0) -> bool:
    """After a refused run or a dry run: remove the run folder Hydra made for it when it holds
    nothing but Hydra's own files and empty folders (a refused run's checkpoint folder), so that
    outputs/ lists runs that trained. Everything such a run had to say is on the console. Rank 0
    only (the only rank with a folder), never a folder with anything of a run's in it (a resumed
    run's checkpoints, metrics.jsonl) nor one whose train.log held an earlier run's lines when
    this one started (earlier_log: run_log_size() then): only what this run made is removed.
    Returns whether it removed it."""
    if os.environ.get("RANK", "0") != "0" or earlier_log > 0:
        return False
    if run_dir is None:
        if _hydra_config() is None:  # run() called from Python: its caller chose the folder
            return False
        run_dir = Path(_hydra_config().runtime.output_dir)
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not _holds_only_hydra_files(run_dir):
        return False
    _close_log_files_in(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    if DATE_FOLDER.fullmatch(run_dir.parent.name):
        with contextlib.suppress(OSError):  # outputs/<date>/ when this was its only run
            run_dir.parent.rmdir()
    return not run_dir.exists()


def _holds_only_hydra_files(folder: Path) -> bool:
    for entry in folder.iterdir():
        if entry.name in HYDRA_FILES:
            continue
        if entry.is_symlink() or not entry.is_dir():
            return False
        if any(p.is_symlink() or not p.is_dir() for p in entry.rglob("*")):
            return False
    return True


def _file_handlers() -> list[logging.FileHandler]:
    loggers = (logging.getLogger(), log)
    return [h for lg in loggers for h in lg.handlers if isinstance(h, logging.FileHandler)]


def _close_log_files_in(folder: Path) -> None:
    for handler in _file_handlers():
        if Path(handler.baseFilename).is_relative_to(folder.absolute()):
            for lg in (logging.getLogger(), log):
                lg.removeHandler(handler)
            handler.close()


def _write_crash_to_log_files(error: BaseException) -> None:
    """A crash's traceback into the run's log file (train.log) too: Hydra prints it only on the
    console, and a job's log is what is read after it died."""
    record = log.makeRecord(
        log.name, logging.ERROR, __file__, 0, "crashed: %s", (describe(error),),
        (type(error), error, error.__traceback__),
    )  # fmt: skip
    for handler in _file_handlers():
        with contextlib.suppress(Exception):  # the log must not hide the crash it reports
            handler.handle(record)


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
        print(composition_error_message(e), file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
    finally:
        _give_hydra_error_reporting_back()


def composition_error_message(error: BaseException) -> str:
    """What a config that Hydra could not compose is reported with: ours first (the unknown key
    and the keys it most likely meant, or the group option and the closest options), then
    Hydra's own message where it adds something (the options it lists). Hydra's advice to
    append a new key with `+key=value` is dropped: a typed schema refuses any new key anyway."""
    from flashtrain.train.config_store import SCHEMA_GROUPS

    sections = {group: list(schemas.values()) for group, schemas in SCHEMA_GROUPS.items()}
    hint = describe_unknown_key(error, elsewhere=sections)
    if hint:
        return hint
    lines = [str(error)]
    if error.__cause__ is not None and isinstance(error.__cause__, USER_ERRORS):
        lines.append(str(error.__cause__))
    option = describe_unknown_option(error)
    return "\n".join(([option] if option else []) + lines)


def describe_unknown_option(error: BaseException) -> str | None:
    """For `model=gpt3` (Hydra's MissingConfigException): the closest options of the group."""
    from hydra.errors import MissingConfigException

    if not isinstance(error, MissingConfigException) or not error.missing_cfg_file:
        return None
    group, _, name = str(error.missing_cfg_file).rpartition("/")
    options = list(error.options or ())
    if not group or not options:
        return None
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    guess = f" (did you mean {' or '.join(group + '=' + c for c in close)}?)" if close else ""
    return f"unknown option {group}={name}{guess}"
