"""Every config group's schema in Hydra's ConfigStore, so Hydra composes YAML onto dataclasses.

configs/train.yaml's defaults list starts with `train_schema` (TrainConfig: the top-level keys
and the trainer / optim / logger groups); each group option's own defaults list names its schema,
e.g. configs/data/openwebtext.yaml starts with `- /schema/data/lm_corpus@_here_`, so choosing
`data=openwebtext` also chooses LMCorpusConfig. A YAML file therefore holds only what differs
from its dataclass, and a key the dataclass lacks fails while composing.

    schema/model/<arch>           flashtrain.models.registry.MODELS (each model class's Config)
    schema/attention/<impl>       flashtrain.models.attention_layers.ATTENTION (each impl's Config)
    schema/data/<loader>          flashtrain.data.registry.DATA (each loader's Config)
    schema/trainer/trainer, schema/optim/adamw, schema/logger/logger
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from flashtrain.data.registry import DATA_CONFIGS
from flashtrain.models.attention_layers import ATTENTION_CONFIGS
from flashtrain.models.registry import MODEL_CONFIGS
from flashtrain.train.config import (
    LoggerConfig,
    OptimConfig,
    TrainConfig,
    TrainerConfig,
    register_resolvers,
)

SCHEMA_GROUPS = {
    "model": MODEL_CONFIGS,
    "attention": ATTENTION_CONFIGS,
    "data": DATA_CONFIGS,
    "trainer": {"trainer": TrainerConfig},
    "optim": {"adamw": OptimConfig},
    "logger": {"logger": LoggerConfig},
}


def register_schemas() -> None:
    """Everything Hydra needs to compose configs/train.yaml: the schemas and the config resolvers.
    Called explicitly by whoever composes (train.py, the tests' compose, scripts), never on import;
    calling it again is harmless."""
    register_resolvers()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, schemas in SCHEMA_GROUPS.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)
