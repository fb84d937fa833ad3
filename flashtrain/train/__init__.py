"""The trainer: the loop, torch.distributed setup (DDP / FSDP2), checkpoints, metrics, loggers.

from flashtrain.train import run
register_schemas()  # before composing configs/train.yaml (train.py does this through Hydra)
run(cfg)            # cfg composed from configs/train.yaml
"""

from flashtrain.train.config import ConfigError, TrainConfig, batch_plan, validate_config
from flashtrain.train.config_store import register_schemas
from flashtrain.train.entry import main, run
from flashtrain.train.trainer import Trainer

__all__ = [
    "ConfigError",
    "TrainConfig",
    "Trainer",
    "batch_plan",
    "main",
    "register_schemas",
    "run",
    "validate_config",
]
