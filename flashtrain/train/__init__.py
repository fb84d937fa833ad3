"""The trainer: the loop, torch.distributed setup (DDP / FSDP2), checkpoints, metrics, loggers.

from flashtrain.train import run
run(cfg)            # cfg composed from configs/train.yaml (train.py does this through Hydra)
"""

from flashtrain.train.config import (
    ConfigError,
    TrainConfig,
    batch_plan,
    register_resolvers,
    validate_config,
)
from flashtrain.train.config_store import register_schemas
from flashtrain.train.entry import main, run
from flashtrain.train.trainer import Trainer

register_resolvers()
register_schemas()

__all__ = ["ConfigError", "TrainConfig", "Trainer", "batch_plan", "main", "run", "validate_config"]
