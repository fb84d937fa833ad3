"""The loaders `data.loader` picks, and build_data / prepare_data: from a data config
(configs/data/<name>.yaml) to a DataModule.

Each loader class carries its config dataclass (flashtrain/data/config.py) as `Config`, whose
`loader` default is its key; the tables are derived from DATA, so a new loader is its file (the
DataModule and its Config), one entry below and a configs/data/<name>.yaml.
"""

from __future__ import annotations

from typing import Any

from flashtrain.data.config import CorpusConfig, DataConfig, LongDocConfig, require
from flashtrain.data.corpus import require_source
from flashtrain.data.lm import TokenCacheLM
from flashtrain.data.long_doc import LongDocClassification
from flashtrain.data.mlm import MaskedLM
from flashtrain.data.module import DataModule, DataRun
from flashtrain.data.pathfinder.dataset import PathfinderClassification
from flashtrain.data.retrieval.loader import RetrievalLM
from flashtrain.data.synthetic import AssociativeRecall
from flashtrain.typed_config import Registry

DATA = Registry(
    "loader",
    "data",
    [
        AssociativeRecall,
        TokenCacheLM,
        MaskedLM,
        PathfinderClassification,
        LongDocClassification,
        RetrievalLM,
    ],
)
LOADERS: dict[str, type[DataModule]] = DATA.classes
DATA_CONFIGS: dict[str, type[DataConfig]] = DATA.configs


def data_config(cfg: Any) -> DataConfig:
    """The config of the loader `cfg.loader` names, from an instance or a mapping."""
    return DATA.config(cfg)


def check_data_source(cfg: DataConfig) -> None:
    """A corpus config names one source (data_files, hub_name or source=pysrc; long_doc its
    data_files): known from the config, so checked before any tokenizer or cache work, and by
    the trainer at start, dry runs included. Not part of the config's validation: a data option
    such as text_files composes without its files, which the command line names."""
    if isinstance(cfg, CorpusConfig):
        require_source(cfg)
    if isinstance(cfg, LongDocConfig):  # labelled records: local files, not a hub dataset
        require(cfg, "data_files", "local .jsonl or .csv files with a text and a label field")


def _loader(cfg: DataConfig) -> type[DataModule]:
    check_data_source(cfg)  # the first error to name
    return DATA.build_class(cfg).for_config(cfg)


def command_line_settings(data_cfg: Any) -> dict[str, Any]:
    """{key: value} that train.py and scripts/prepare_data.py set on a data config: the
    library works in the calling process by default, and these programs, whose top level is
    guarded, use worker processes where the config leaves it open (Pathfinder's
    data.num_workers=null: all cores)."""
    cfg = data_config(data_cfg)
    return DATA.build_class(cfg).for_config(cfg).command_line_settings(cfg)


def build_data(
    data_cfg: Any,
    *,
    seq_len: int,
    micro_batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    eval_batches: int | None = None,
) -> DataModule:
    """The DataModule for a data config (its dataclass, a DictConfig or a dict); see
    docs/interfaces.md for the batches of each task. eval_batches: validation batches per rank
    (trainer.eval_batches; None: all the validation data, where it is finite)."""
    cfg = data_config(data_cfg)
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError(
            f"seq_len and micro_batch_size must be >= 1, got {seq_len}, {micro_batch_size}"
        )
    if eval_batches is not None and eval_batches < 1:
        raise ValueError(f"eval_batches must be >= 1 or None (all), got {eval_batches}")
    run = DataRun(seq_len, micro_batch_size, seed, rank, world_size, eval_batches)
    loader = _loader(cfg)
    loader.check_run_settings(cfg, seq_len=seq_len, eval_batches=eval_batches)
    return loader(cfg, run)


def prepare_data(data_cfg: Any, *, progress: bool = True) -> dict:
    """Do the one-off work of a data config (tokenize into caches, generate Pathfinder images)
    and return what was made: {split: token / example / image counts, "cache": where}."""
    cfg = data_config(data_cfg)
    return _loader(cfg).prepare(cfg, progress=progress)
