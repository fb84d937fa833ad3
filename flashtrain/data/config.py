"""The data configs: the schemas of configs/data/*.yaml, one dataclass per loader.

`loader` picks the loader (synthetic | lm_corpus | mlm | pathfinder | long_doc: registry.py maps it
to the DataModule class, which carries its dataclass as `Config`) and so the dataclass; each YAML
keeps only what differs from its defaults. Every config names the data (`name`: messages and
cache folders) and says how many token ids it produces (`vocab_size`: the model's embedding,
through ${data.vocab_size}); classification data also its `num_classes`.
How much is evaluated is the trainer's `trainer.eval_batches` (build_data's eval_batches).

    cfg = data_config({"loader": "lm_corpus", "data_files": "corpus/*.txt"})  # registry.py
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashtrain.data.hf_tokenizer import hf_reference, is_hf_tokenizer
from flashtrain.data.pathfinder.generator import RESOLUTIONS, check_contour_length
from flashtrain.data.retrieval.registry import resolve_tasks
from flashtrain.data.tokenization import TOKENIZER_CHOICES
from flashtrain.typed_config import check_choice

DEFAULT_CACHE_ROOT = "data_cache"
CORPUS_SOURCES = (
    None,
    "pysrc",
)  # data.source: None = data_files or hub_name  # relative to the working directory; FLASHTRAIN_DATA overrides


@dataclass
class DataConfig:
    loader: str = ""  # the loader's key in registry.DATA
    name: str = ""  # the data's name: messages, cache folder names


@dataclass
class SyntheticConfig(DataConfig):
    """Associative recall generated from the seed (flashtrain/data/synthetic.py); nothing cached."""

    loader: str = "synthetic"
    name: str = "synthetic"
    num_keys: int = 128  # keys recur every ~num_keys pairs
    num_values: int = 128
    vocab_size: int = 256  # >= num_keys + num_values (ids above those never occur)
    loss_on: str = "values"  # values: score only value positions (next keys are noise) | all

    def __post_init__(self):
        check_choice(self.loss_on, ("values", "all"), "data.loss_on")
        at_least(self, 1, "num_keys", "num_values")
        needed = self.num_keys + self.num_values
        if self.vocab_size < needed:
            raise ValueError(
                f"synthetic data needs vocab_size >= num_keys + num_values = {needed}, "
                f"got {self.vocab_size}"
            )


@dataclass
class RetrievalConfig(DataConfig):
    """Retrieval-shaped documents generated from the seed (flashtrain/data/retrieval.py): one
    sample of a retrieval task (flashtrain/tasks: passkey, needle, ...) per window, the needle
    at a random depth, in bytes; nothing cached. What experiment=cpu/passkey trains on."""

    loader: str = "retrieval"
    name: str = "retrieval"
    tasks: list[str] = field(default_factory=lambda: ["passkey"])  # task names or groups
    tokenizer: str = "byte"  # the documents' tokenizer (bytes only)
    vocab_size: int = 258  # byte: 256 bytes + <eos> + <pad>
    loss_on: str = "answers"  # answers: only the digits and words a task hides and asks | all

    def __post_init__(self):
        check_choice(self.tokenizer, ("byte",), "data.tokenizer")
        check_choice(self.loss_on, ("answers", "all"), "data.loss_on")
        self.tasks = resolve_tasks(list(self.tasks))
        if self.vocab_size < 258:
            raise ValueError(f"data.vocab_size must be >= 258 for bytes, got {self.vocab_size}")


@dataclass
class CachedDataConfig(DataConfig):
    cache_dir: str | None = None  # token caches, images; None: $FLASHTRAIN_DATA, else ./data_cache


@dataclass
class CorpusConfig(CachedDataConfig):
    """A text source (local files or a Hugging Face hub dataset) and its tokenizer."""

    source: str | None = None  # "pysrc": this Python's standard library (flashtrain/data/pysrc.py)
    # pysrc: only the files under this folder: a stdlib one ("json"), or with pysrc_packages a
    # package's ("packages/numpy")
    pysrc_under: str | None = None
    # pysrc: also the .py files of this Python's installed packages (site-packages / dist-packages)
    pysrc_packages: bool = False
    data_files: Any = None  # local .txt / .jsonl / .json / .parquet / .csv path(s), globs allowed
    val_files: Any = None  # their own validation files; else val_fraction of the documents
    hub_name: str | None = None  # or a Hugging Face dataset
    hub_config: str | None = None
    train_split: str = "train"
    val_split: str | None = None  # the hub's validation split; None: carve val_fraction
    val_fraction: float = 0.01
    test_fraction: float = 0.0  # pysrc: held-out test files (split by path hash, never trained on)
    split_seed: int = 1234
    text_field: str = "text"  # the column with the text (jsonl / parquet / csv)
    sample_by: str = "document"  # .txt files: document (a file) | paragraph | line
    # byte | byte_mlm (+ BERT's specials; no files) | gpt2 | wordpiece | hf:<folder or hub id>
    # (a Hugging Face tokenizer; the default under model.init_from=hf:, train/config.py)
    tokenizer: str = "byte"
    tokenizer_path: str | None = None  # vocabulary folder or file (gpt2 / wordpiece)
    tokenizer_name: str = "bert-base-uncased"  # wordpiece: folder under <cache_dir>/tokenizers/
    lowercase: bool = True  # wordpiece
    vocab_size: int = 258  # the tokenizer's id count (byte: 256 bytes + <eos> + <pad>)
    num_proc: int | None = None  # tokenization processes (pysrc: and its file-reading ones)
    # Token-cache body checksum on open: None = when the cache is <= 1 GiB, True = always, False = never.
    verify_cache: bool | None = None

    def __post_init__(self):
        if is_hf_tokenizer(self.tokenizer):
            hf_reference(self.tokenizer)  # a bare "hf:" is refused
        else:
            check_choice(self.tokenizer, TOKENIZER_CHOICES, "data.tokenizer")
        check_choice(self.sample_by, ("document", "paragraph", "line"), "data.sample_by")
        check_choice(self.source, CORPUS_SOURCES, "data.source")
        for key in ("val_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"data.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"data.val_fraction + data.test_fraction must be < 1 (the rest trains), got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        at_least(self, 0, "split_seed")
        at_least(self, 1, "num_proc", unset="null: one process")


@dataclass
class LMCorpusConfig(CorpusConfig):
    """Language-model windows from a token cache, or streamed (flashtrain/data/lm*.py)."""

    loader: str = "lm_corpus"
    name: str = "corpus"
    eos_policy: str = "append"  # append: <eos> after every document | none
    # hf: tokenizers: the token that ends a document (None: the one its tokenizer_config.json
    # names, else its one end-of-text special token, e.g. <|endoftext|>: hf_tokenizer.py)
    eos_token: str | None = None
    # attention stays inside each EOS-separated document (varlen kernel, positions restart);
    # needs attention=flash; no effect with eos_policy=none
    document_masking: bool = True
    streaming: bool = False  # true: read + tokenize on the fly (corpora larger than the disk)
    shuffle_buffer: int = 10000  # streaming: documents in the seeded shuffle buffer (0: none)

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.eos_policy, ("append", "none"), "data.eos_policy")
        if self.eos_token is not None and not is_hf_tokenizer(self.tokenizer):
            raise ValueError(
                f"data.eos_token={self.eos_token!r} names the EOS of an hf: tokenizer; "
                f"data.tokenizer={self.tokenizer} has its own: leave data.eos_token unset"
            )
        at_least(self, 0, "shuffle_buffer")  # 0: no shuffle


@dataclass
class MLMConfig(CorpusConfig):
    """BERT masked-LM sequence pairs from a token cache (flashtrain/data/mlm.py): WordPiece, or
    bytes with BERT's special tokens (tokenizer byte_mlm, vocab_size 260: configs/data/pysrc_mlm)."""

    loader: str = "mlm"
    name: str = "bert_mlm"
    tokenizer: str = "wordpiece"
    vocab_size: int = 30522
    preset: str = "default"  # default | mlperf (see mlm.PRESETS)
    mask_prob: float = 0.15
    max_predictions_per_seq: int | None = None
    short_seq_prob: float = 0.1
    dynamic_masking: bool = True  # a new mask every epoch (RoBERTa); false: one fixed mask


@dataclass
class LongDocConfig(CorpusConfig):
    """Long-document classification records (flashtrain/data/long_doc.py)."""

    loader: str = "long_doc"
    name: str = "long_doc"
    val_fraction: float = 0.1
    label_field: str = "label"
    labels: list[str] | None = None  # class names in id order; None: integers, or sorted names
    num_classes: int = 2
    mode: str = "truncate"  # truncate | chunk (every chunk carries the document's label)
    max_chunks_per_doc: int = 8

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.mode, ("truncate", "chunk"), "data.mode")


MIN_PATHFINDER_SAMPLES = 20


@dataclass
class PathfinderConfig(CachedDataConfig):
    """Pathfinder images generated once and cached (flashtrain/data/pathfinder/)."""

    loader: str = "pathfinder"
    name: str = "pathfinder"
    resolution: int = 128  # 32 | 64 | 128 (Path-X) | 256 (Path-256); seq_len = resolution**2
    # LRA difficulty: 6 (easy), 9, 14 (hard); at most generator.MAX_CONTOUR_LENGTHS
    contour_length: int = 14
    num_samples: int = 200_000  # LRA used 200K images per difficulty
    generator_seed: int = 0
    # generator processes: null or 1 = the calling process, N > 1 = N workers (the calling
    # script's top level must be guarded); train.py and scripts/prepare_data.py read null as
    # all cores
    num_workers: int | None = None
    vocab_size: int = 256  # pixel intensities
    num_classes: int = 2  # the two markers on one contour or not

    def __post_init__(self):
        check_choice(self.resolution, RESOLUTIONS, "data.resolution")
        # what the generator can lay out: refused here, dry runs included, not mid-generation
        check_contour_length(self.resolution, self.contour_length, "data.contour_length")
        if self.num_samples < MIN_PATHFINDER_SAMPLES:  # 80/10/10: two images in each held-out split
            raise ValueError(
                f"data.num_samples must be >= {MIN_PATHFINDER_SAMPLES} (validation and test get "
                f"10% each, at least one image of each label), got {self.num_samples}"
            )
        at_least(self, 0, "generator_seed")
        at_least(self, 1, "num_workers", unset="null: all cores")
        if (self.vocab_size, self.num_classes) != (256, 2):
            raise ValueError(
                "Pathfinder images have 256 pixel values and 2 classes: data.vocab_size=256, "
                f"data.num_classes=2; got {self.vocab_size}, {self.num_classes}"
            )


def at_least(cfg: DataConfig, minimum: int, *keys: str, unset: str | None = None) -> None:
    """Each data.<key> is >= minimum; unset: what null means, when null is allowed."""
    for key in keys:
        value = getattr(cfg, key)
        if value is None and unset is not None:
            continue
        if value is None or value < minimum:
            allowed = f">= {minimum}" + (f" or null ({unset})" if unset else "")
            raise ValueError(f"data.{key} must be {allowed}, got {value}")


def cache_root(cfg: CachedDataConfig) -> Path:
    """The configured cache directory (`cache_dir`), else $FLASHTRAIN_DATA, else ./data_cache."""
    root = cfg.cache_dir or os.environ.get("FLASHTRAIN_DATA") or DEFAULT_CACHE_ROOT
    return Path(root).expanduser()


def require(cfg: DataConfig, key: str, what: str) -> Any:
    if getattr(cfg, key) is None:
        raise ValueError(f"data config '{cfg.name}' needs `{key}`: {what}")
    return getattr(cfg, key)


def check_vocab_size(cfg: CorpusConfig, tokenizer_ids: int, tokenizer_name: str) -> int:
    """data.vocab_size, which must be the tokenizer's id count (padding the embedding for speed is
    the model's pad_vocab_multiple, whose rows the loss ignores)."""
    if cfg.vocab_size != tokenizer_ids:
        raise ValueError(
            f"data.vocab_size={cfg.vocab_size} but tokenizer '{tokenizer_name}' has "
            f"{tokenizer_ids} ids; set data.vocab_size={tokenizer_ids} (to round the embedding "
            f"up for speed, set model.pad_vocab_multiple, e.g. 64)"
        )
    return cfg.vocab_size
