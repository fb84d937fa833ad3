"""What a run checks at start, before the model is built, the dry run included: what the
config (validated already: config.py) rules out only together with the machine, and what the
data needs that its config's validation leaves open. A real run and a dry run call the one
function, so a dry run that passes is not followed by a real run refused for its settings.

    the data's source: a corpus names its files, hub dataset or source=pysrc (data/registry.py)
    trainer.ckpt_dir: a folder this run can create and write (checkpoint/run_lock.py)
    logger.dir: likewise, for logger=wandb / tensorboard (loggers.py)

The folders are looked at, not written (a dry run writes nothing); the real run's first writes
(the checkpoint lock, the loggers) refuse in the same words what only writing shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashtrain.checkpoint.run_lock import check_checkpoint_folder
from flashtrain.collectives import on_rank_0
from flashtrain.data.registry import check_data_source
from flashtrain.train.loggers import check_logger_dir
from flashtrain.typed_config import ConfigError


def check_run_start(cfg: Any, *, run_dir: Path, ckpt_root: Path, is_main: bool) -> None:
    """Refuse (ConfigError) a run whose settings cannot work here: rank 0 looks (the folders
    are its to write, or shared by every rank), every rank learns its verdict (call it on each
    rank of the process group)."""

    def check() -> None:
        try:
            check_data_source(cfg.data)  # the data layer's ValueError names the data config
            check_checkpoint_folder(ckpt_root)
            check_logger_dir(cfg, run_dir)
        except ConfigError:
            raise
        except ValueError as e:  # the data layer's: a user error all the same
            raise ConfigError(str(e)) from e

    on_rank_0(check, (ConfigError,), is_main=is_main)
