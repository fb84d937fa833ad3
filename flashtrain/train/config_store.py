"""Every config group's schema in Hydra's ConfigStore, so Hydra composes YAML onto dataclasses.

configs/train.yaml's defaults list starts with `train_schema` (TrainConfig: the top-level keys
and the trainer / optim / logger groups); each group option's own defaults list names its schema,
e.g. configs/data/openwebtext.yaml starts with `- /schema/data/lm_corpus@_here_`, so choosing
`data=openwebtext` also chooses LMCorpusConfig. A YAML file therefore holds only what differs
from its dataclass, and a key the dataclass lacks fails while composing.

    schema/model/<arch>           flashtrain.models.config.MODEL_CONFIGS
    schema/attention/<impl>       flashtrain.models.attention_layers.ATTENTION_CONFIGS
    schema/data/<loader>          flashtrain.data.config.DATA_CONFIGS
    schema/trainer/trainer, schema/optim/adamw, schema/logger/logger
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from flashtrain.data.config import DATA_CONFIGS
from flashtrain.models.attention_layers import ATTENTION_CONFIGS
from flashtrain.models.config import MODEL_CONFIGS
from flashtrain.train.config import LoggerConfig, OptimConfig, TrainConfig, TrainerConfig

SCHEMA_GROUPS = {
    "model": MODEL_CONFIGS,
    "attention": ATTENTION_CONFIGS,
    "data": DATA_CONFIGS,
    "trainer": {"trainer": TrainerConfig},
    "optim": {"adamw": OptimConfig},
    "logger": {"logger": LoggerConfig},
}


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, schemas in SCHEMA_GROUPS.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)
