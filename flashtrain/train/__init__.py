"""The trainer: the loop, torch.distributed setup (DDP / FSDP2), checkpoints, metrics, loggers.

from flashtrain.train import run
run(cfg)            # cfg composed from configs/train.yaml (train.py does this through Hydra)
"""

from flashtrain.train.config import ConfigError, batch_plan, register_resolvers, validate_config
from flashtrain.train.entry import main, run
from flashtrain.train.trainer import Trainer

register_resolvers()

__all__ = ["ConfigError", "Trainer", "batch_plan", "main", "run", "validate_config"]
