"""build_data / prepare_data: from a data config (configs/data/<name>.yaml) to a DataModule."""

from __future__ import annotations

from typing import Any

from flashtrain.config_dict import to_plain_dict
from flashtrain.data.config import cache_root
from flashtrain.data.corpus import require_source
from flashtrain.data.module import DataModule

# loader -> what it builds; the config's `loader` key picks one, else its `name` does.
LOADERS = ("synthetic", "lm_corpus", "mlm", "pathfinder", "long_doc")
NAME_TO_LOADER = {
    "synthetic": "synthetic",
    "text_files": "lm_corpus",
    "openwebtext": "lm_corpus",
    "wikitext103": "lm_corpus",
    "pg19": "lm_corpus",
    "bert_mlm": "mlm",
    "pathfinder32": "pathfinder",
    "pathfinder64": "pathfinder",
    "pathx": "pathfinder",
    "path256": "pathfinder",
    "long_doc": "long_doc",
}


def loader_of(cfg: dict) -> str:
    loader = cfg.get("loader") or NAME_TO_LOADER.get(cfg.get("name"))
    if loader not in LOADERS:
        raise ValueError(
            f"unknown data '{cfg.get('name')}' (loader={cfg.get('loader')!r}); known names: "
            f"{', '.join(sorted(NAME_TO_LOADER))}; or set `loader` to one of {', '.join(LOADERS)}"
        )
    return loader


def _module_class(loader: str, cfg: dict):
    if loader == "synthetic":
        from flashtrain.data.synthetic import AssociativeRecall

        return AssociativeRecall
    if loader == "lm_corpus":
        if cfg.get("streaming"):
            from flashtrain.data.lm_stream import StreamingLM

            return StreamingLM
        from flashtrain.data.lm import TokenCacheLM

        return TokenCacheLM
    if loader == "mlm":
        from flashtrain.data.mlm import MaskedLM

        return MaskedLM
    if loader == "pathfinder":
        from flashtrain.data.pathfinder_data import PathfinderClassification

        return PathfinderClassification
    from flashtrain.data.long_doc import LongDocClassification

    return LongDocClassification


def build_data(
    data_cfg: Any,
    *,
    seq_len: int,
    micro_batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> DataModule:
    """The DataModule for a data config (OmegaConf DictConfig or plain dict); see
    docs/interfaces.md for the batches of each task."""
    cfg = to_plain_dict(data_cfg, what="data config")
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError(
            f"seq_len and micro_batch_size must be >= 1, got {seq_len}, {micro_batch_size}"
        )
    loader = loader_of(cfg)
    if loader in ("lm_corpus", "mlm"):
        require_source(cfg)
    module = _module_class(loader, cfg)(
        cfg,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    return module


def prepare_data(data_cfg: Any, *, progress: bool = True) -> dict:
    """Do the one-off work of a data config (tokenize into caches, generate Pathfinder images)
    and return what was made: {split: token / example / image counts, "cache": where}."""
    cfg = to_plain_dict(data_cfg, what="data config")
    loader = loader_of(cfg)
    if loader == "synthetic":
        return {"note": "synthetic data is generated on the fly; nothing to prepare"}
    if loader in ("lm_corpus", "mlm"):
        if cfg.get("streaming"):
            return {
                "note": "streaming corpora are read and tokenized on the fly; nothing to prepare"
            }
        from flashtrain.data.corpus import open_corpus
        from flashtrain.data.tokenization import build_tokenizer

        require_source(cfg)
        if loader == "mlm":
            cfg = {"tokenizer": "wordpiece", **cfg, "eos_policy": "none"}
        tokenizer = build_tokenizer(cfg, cache_root(cfg))
        files = open_corpus(cfg, tokenizer, progress=progress)
        summary = {f"{split}_tokens": f.num_tokens for split, f in files.items()}
        summary |= {f"{split}_documents": f.num_docs for split, f in files.items()}
        return summary | {"tokenizer": tokenizer.name, "cache": str(files["train"].path.parent)}
    if loader == "pathfinder":
        from flashtrain.data.pathfinder_cache import load_or_generate, pathfinder_cache_dir
        from flashtrain.data.pathfinder_data import config_resolution, split_ranges

        args = (
            config_resolution(cfg),
            int(cfg.get("contour_length", 14)),
            int(cfg.get("num_samples", 200_000)),
            int(cfg.get("generator_seed", 0)),
        )
        images, _ = load_or_generate(
            cache_root(cfg), *args, num_workers=cfg.get("num_workers"), progress=progress
        )
        summary = {
            f"{split}_images": hi - lo for split, (lo, hi) in split_ranges(len(images)).items()
        }
        return summary | {"cache": str(pathfinder_cache_dir(cache_root(cfg), *args))}
    from flashtrain.data.corpus import train_val_splits

    train, val = train_val_splits(cfg)
    return {"train_documents": len(train), "validation_documents": len(val)}
