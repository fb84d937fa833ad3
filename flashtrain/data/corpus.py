"""Text corpora through Hugging Face `datasets`, and their preparation into token caches.

A corpus is a hub dataset (`hub_name`, `hub_config`), local files (`data_files`: .txt / .jsonl /
.json / .parquet / .csv, globs allowed) read by the `datasets` packaged builders, or `source:
pysrc` (this Python's standard library, and with `pysrc_packages` its installed packages' source
too, flashtrain/data/pysrc.py). The validation split is the source's own (`val_split`), a seeded
fraction of the documents (`val_fraction`, `split_seed`), or for pysrc a fraction by path hash
(with `test_fraction` held out), so it is the same on every run and machine.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from flashtrain.data import pysrc
from flashtrain.data.config import CorpusConfig, cache_root
from flashtrain.data.corpus_check import read_errors_explained
from flashtrain.data.files import (
    describe_missing,
    exclusive_lock,
    remove_stale_temporaries,
    scratch_folder,
)
from flashtrain.data.text_encoding import UTF8_BUILDERS, check_utf8
from flashtrain.data.token_cache import VERSION, open_token_file, write_token_file
from flashtrain.data.tokenization import Tokenizer, no_eos_error
from flashtrain.no_space import free_space, no_space_named, shortage
from flashtrain.typed_config import ConfigError

LOCAL_BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}
SPLITS = ("train", "validation")


def resolve_local_files(patterns) -> list[str]:
    """Existing files matching the pattern(s), sorted; an error naming what is allowed if none."""
    if isinstance(patterns, str):
        patterns = [patterns]
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(str(pattern)), recursive=True))
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise FileNotFoundError(describe_missing(str(pattern), "/".join(LOCAL_BUILDERS)))
        files.extend(matches)
    return files


def local_builder(files: list[str]) -> str:
    """The packaged `datasets` builder for these files (one kind per corpus)."""
    suffixes = {Path(f).suffix.lower() for f in files}
    builders = {LOCAL_BUILDERS.get(s) for s in suffixes}
    if None in builders or len(builders) != 1:
        raise ValueError(
            f"data files must all be one of the kinds {sorted(LOCAL_BUILDERS)} "
            f"(text / json lines / parquet / csv); got suffixes {sorted(suffixes)}"
        )
    return builders.pop()


def _hf_cache(cfg: CorpusConfig) -> str:
    return str(cache_root(cfg) / "hf_datasets")


def load_split(cfg: CorpusConfig, split: str, *, streaming: bool = False):
    """A `datasets` Dataset (or IterableDataset) of one split of the configured source, or None
    when the source has no such split (the validation split is then carved from train)."""
    from datasets import load_dataset

    require_source(cfg)
    if cfg.data_files:
        key = "data_files" if split == "train" else "val_files"
        patterns = getattr(cfg, key)
        if not patterns:
            return None
        files = resolve_local_files(patterns)
        builder = local_builder(files)
        if builder in UTF8_BUILDERS:
            for file in files:
                check_utf8(file, f"data.{key}")
        extra = {"sample_by": cfg.sample_by} if builder == "text" else {}
        with read_errors_explained(files, f"data.{key}", builder):
            return load_dataset(
                builder,
                data_files={split: files},
                split=split,
                streaming=streaming,
                cache_dir=_hf_cache(cfg),
                **extra,
            )
    hub_split = cfg.train_split if split == "train" else cfg.val_split
    if hub_split is None:
        return None
    return load_dataset(
        cfg.hub_name, cfg.hub_config, split=hub_split, streaming=streaming, cache_dir=_hf_cache(cfg)
    )


def read_documents(cfg: CorpusConfig, split: str, stream):
    """The documents of a streamed split (load_split(..., streaming=True), then skipped,
    shuffled or split by node), read as they are iterated: local files that `datasets` fails
    to read (a truncated .jsonl, files with other fields) are one ConfigError line naming the
    file and line (corpus_check.py), not a parser's traceback in the middle of training."""
    if not cfg.data_files:
        yield from stream
        return
    key = "data_files" if split == "train" else "val_files"
    files = resolve_local_files(getattr(cfg, key))
    with read_errors_explained(files, f"data.{key}", local_builder(files)):
        yield from stream


def require_source(cfg: CorpusConfig) -> None:
    """Checked before any tokenizer or cache work, so a missing source is the first error named."""
    if cfg.source == "pysrc":
        if cfg.data_files or cfg.hub_name:
            raise ValueError(
                f"data config '{cfg.name}' has source=pysrc and also data_files / hub_name; "
                "pick one source"
            )
        if getattr(cfg, "streaming", False):
            raise ValueError(
                "data.streaming=true is not supported for pysrc (the standard library is a few "
                "tens of MB: its token cache is built once); set data.streaming=false"
            )
        return
    if not cfg.data_files and not cfg.hub_name:
        raise ValueError(
            f"data config '{cfg.name}' names no source: set data_files (local .txt/.jsonl/"
            ".parquet/.csv files), hub_name (a Hugging Face dataset) or source=pysrc"
        )


def _pysrc_files(cfg: CorpusConfig) -> list[pysrc.SourceFile]:
    """The files of the corpus (the stdlib's, and with data.pysrc_packages the installed
    packages' as "packages/..."): all, or those under data.pysrc_under."""
    files = pysrc.corpus_files(packages=cfg.pysrc_packages)
    if cfg.pysrc_under:
        prefix = cfg.pysrc_under.strip("/") + "/"
        files = [f for f in files if f.path.startswith(prefix)]
        if not files:
            raise FileNotFoundError(_no_files_under(cfg, prefix))
    return files


def _no_files_under(cfg: CorpusConfig, prefix: str) -> str:
    """Why data.pysrc_under selected nothing, and what it may name."""
    packages = pysrc.PACKAGES + "/"
    if prefix.startswith(packages) and not cfg.pysrc_packages:
        return (
            f"pysrc: data.pysrc_under={cfg.pysrc_under!r} names a package folder, but the "
            "installed packages are not in the corpus; set data.pysrc_packages=true"
        )
    allowed = "a stdlib folder, e.g. 'json'"
    if prefix.startswith(packages):
        roots = ", ".join(map(str, pysrc.package_roots())) or "none found"
        where = f"{prefix.removeprefix(packages)} in any package root ({roots})"
    else:
        where = str(pysrc.stdlib_root() / prefix)
    if cfg.pysrc_packages:
        allowed += ", or 'packages/<folder in a package root>', e.g. 'packages/numpy'"
    return f"pysrc: no .py files under {where} (data.pysrc_under={cfg.pysrc_under!r}: {allowed})"


def train_val_splits(cfg: CorpusConfig, scratch: Path | None = None):
    """(train, validation) Datasets; validation carved deterministically when the source lacks it.
    pysrc splits by path hash (its test files are left out of both). scratch: a folder for the
    carved splits' index files (else `datasets` leaves them beside its copy of the source)."""
    if cfg.source == "pysrc":
        splits = pysrc.load_pysrc(
            None,
            cfg.val_fraction,
            cfg.test_fraction,
            files=_pysrc_files(cfg),
            num_proc=cfg.num_proc,
        )
        if len(splits["train"]) == 0 or len(splits["validation"]) == 0:
            raise ValueError(
                f"pysrc split of {sum(map(len, splits.values()))} file(s) left "
                f"{len(splits['train'])} for training and {len(splits['validation'])} for "
                "validation; both need >= 1 (raise data.val_fraction or widen data.pysrc_under)"
            )
        return splits["train"], splits["validation"]
    train = load_split(cfg, "train")
    val = load_split(cfg, "validation")
    if val is not None:
        return train, val
    if len(train) < 2:
        raise ValueError(f"corpus has {len(train)} document(s); need >= 2 to split off validation")
    n_val = min(len(train) - 1, max(1, round(len(train) * cfg.val_fraction)))
    indices = {}
    if scratch is not None:
        indices = {
            "train_indices_cache_file_name": str(scratch / "train-indices.arrow"),
            "test_indices_cache_file_name": str(scratch / "validation-indices.arrow"),
        }
    parts = train.train_test_split(test_size=n_val, seed=cfg.split_seed, shuffle=True, **indices)
    return parts["train"], parts["test"]


def source_spec(cfg: CorpusConfig, tokenizer: Tokenizer, eos_policy: str) -> dict:
    """Everything that decides the cache contents; its hash names the cache directory."""
    if cfg.source == "pysrc":
        source = {
            "pysrc": pysrc.corpus_version(_pysrc_files(cfg)),
            "under": cfg.pysrc_under,
            "fractions": [float(cfg.val_fraction), float(cfg.test_fraction)],
        }
        if cfg.pysrc_packages:  # only then: a stdlib-only spec, and its cache name, stay as before
            source["packages"] = True
    elif cfg.data_files:
        files = {
            key: [
                (f, os.path.getsize(f), os.stat(f).st_mtime_ns)
                for f in resolve_local_files(getattr(cfg, key))
            ]
            for key in ("data_files", "val_files")
            if getattr(cfg, key)
        }
        source = {"local": files, "sample_by": cfg.sample_by}
    else:
        source = {
            k: getattr(cfg, k) for k in ("hub_name", "hub_config", "train_split", "val_split")
        }
    return {
        "source": source,
        "text_field": cfg.text_field,
        "split": None
        if cfg.val_files or cfg.val_split or cfg.source
        else [float(cfg.val_fraction), int(cfg.split_seed)],
        "tokenizer": tokenizer.name,
        "eos_policy": eos_policy,
        "cache_version": VERSION,
    }


def corpus_cache_dir(cfg: CorpusConfig, tokenizer: Tokenizer, eos_policy: str) -> Path:
    """<cache_dir>/tokens/<name>-<tokenizer>-eos_<policy>-<hash of the source spec>."""
    spec = source_spec(cfg, tokenizer, eos_policy)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    # "hf:<fingerprint>" names a folder as "hf-<fingerprint>": no ':' in paths (rsync, scp, PATH)
    slug = f"{cfg.name}-{tokenizer.name.replace(':', '-')}-eos_{eos_policy}-{digest}"
    return cache_root(cfg) / "tokens" / slug


def tokenize(
    dataset,
    tokenizer: Tokenizer,
    *,
    text_field: str,
    eos_policy: str,
    num_proc: int | None,
    cache_file: Path | None = None,
):
    """Map documents to token ids (+ EOS), dropping empty ones; parallel with a progress bar.
    cache_file: where `datasets` writes the result (one file per worker process, named after
    it); default beside the source's files."""
    from datasets import Features, List, Value

    if text_field not in dataset.column_names:
        raise KeyError(
            f"documents have no '{text_field}' field (have {dataset.column_names}); set data.text_field"
        )
    kind = getattr(dataset.features[text_field], "dtype", None)
    if kind not in ("string", "large_string"):  # e.g. numbers: encode() would fail mid-map
        raise ConfigError(
            f"data.text_field '{text_field}' holds {dataset.features[text_field]} values, not "
            f"text: name the field that holds each document's text"
        )
    eos = [tokenizer.eos_id] if eos_policy == "append" else []

    def encode(batch):
        texts = [t for t in batch[text_field] if t and t.strip()]
        ids = [doc + eos for doc in tokenizer.encode_batch(texts)]
        return {"ids": ids, "length": [len(doc) for doc in ids]}

    if num_proc and num_proc > 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no Rust threads across forks
    return dataset.map(
        encode,
        batched=True,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        features=Features({"ids": List(Value("uint32")), "length": Value("int64")}),
        desc="tokenizing",
        cache_file_name=None if cache_file is None else str(cache_file),
    )


def _arrow_chunks(tokenized, batch_size: int = 4096):
    """(ids, lengths) numpy pairs straight from the Arrow columns (no Python lists)."""
    for table in tokenized.with_format("arrow").iter(batch_size=batch_size):
        column = table["ids"].combine_chunks()
        yield column.flatten().to_numpy(), column.value_lengths().to_numpy()


def prepare_corpus(
    cfg: CorpusConfig, tokenizer: Tokenizer, *, eos_policy: str, progress: bool = True
) -> dict[str, Path]:
    """Build (or verify) the token cache of both splits; returns {split: path}. Safe to call from
    every rank at once: one prepares under a lock, the others then find the finished files.
    eos_policy: append (<eos> after every document) | none.

    `datasets`' intermediate files (its tokenized copy, the split's indices) go to a scratch
    folder in the cache folder, removed when the cache is built. A build that fails removes what
    it wrote, and a full disk or spent quota is one line naming the folder and data.cache_dir
    (NoSpaceError)."""
    directory = corpus_cache_dir(cfg, tokenizer, eos_policy)
    if eos_policy == "append" and tokenizer.eos_id is None:
        raise no_eos_error(tokenizer, "or set data.eos_policy=none")
    paths = {split: directory / f"{split}.bin" for split in SPLITS}
    with exclusive_lock(directory.parent, f".{directory.name}.lock"):
        for p in [*paths.values(), directory / SCRATCH]:
            remove_stale_temporaries(p)
        if all(p.exists() for p in paths.values()):
            for p in paths.values():  # refuse rather than silently rebuild a damaged cache
                # (header and size here; open_corpus checks the body next)
                open_token_file(p, tokenizer=tokenizer.name, eos_policy=eos_policy, verify=False)
            return paths
        no_space = functools.partial(_no_space_message, cache_root(cfg), directory)
        with no_space_named(no_space), _removed_unless_complete(directory, paths):
            _build_cache(cfg, tokenizer, eos_policy, paths, progress=progress)
    return paths


def _no_space_message(root: Path, directory: Path, code: int, refused: Path | None) -> str:
    """The line for a token cache build that ran out of space (or quota): under data.cache_dir,
    or where `datasets` or the hub keep their own files when the refused file is there."""
    if refused is not None and not refused.absolute().is_relative_to(root.absolute()):
        where = f"{free_space(code, refused.parent)}, where {refused.name} was being written"
    else:
        where = (
            f"{free_space(code, root)} (data.cache_dir), or set data.cache_dir to a folder on "
            "another disk"
        )
    return (
        f"{shortage(code)} building the token cache {directory}: the partial files were "
        f"removed; {where}"
    )


SCRATCH = "datasets"  # the scratch folder's name: .datasets.<pid>-<id>.tmp in the cache folder
SPEC = "spec.json"


@contextlib.contextmanager
def _removed_unless_complete(directory: Path, paths: dict[str, Path]):
    """A build that fails leaves nothing: the token files it finished (a cache is complete
    with all of them or useless), spec.json and the cache folder, once empty."""
    try:
        yield
    except BaseException:
        for path in [*paths.values(), directory / SPEC]:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something else is in it, kept
            directory.rmdir()
        raise


def _build_cache(
    cfg: CorpusConfig, tokenizer: Tokenizer, eos_policy: str, paths: dict, *, progress: bool
) -> None:
    """Write the token files `paths` ({split: path}, in one folder); call holding its lock."""
    directory = paths["train"].parent
    directory.mkdir(parents=True, exist_ok=True)
    spec = source_spec(cfg, tokenizer, eos_policy)
    (directory / SPEC).write_text(json.dumps(spec, indent=1, sort_keys=True))
    with scratch_folder(directory / SCRATCH) as scratch:
        splits = dict(zip(SPLITS, train_val_splits(cfg, scratch)))
        for split, dataset in splits.items():
            tokenized = tokenize(
                dataset,
                tokenizer,
                text_field=cfg.text_field,
                eos_policy=eos_policy,
                num_proc=cfg.num_proc,
                cache_file=scratch / f"{split}-tokens.arrow",
            )
            lengths = np.asarray(tokenized["length"], dtype=np.int64)
            write_token_file(
                paths[split],
                _arrow_chunks(tokenized),
                num_tokens=int(lengths.sum()),
                num_docs=len(lengths),
                tokenizer=tokenizer.name,
                vocab_size=tokenizer.vocab_size,
                eos_policy=eos_policy,
                eos_id=tokenizer.eos_id,
                source=_header_source(spec, directory.name),
                progress=progress,
            )


def _header_source(spec: dict, cache_name: str) -> str:
    """What the token file's header names as its source: the cache folder, and for pysrc the
    corpus version (Python version + file-list hash) that the tokens came from."""
    version = spec["source"].get("pysrc")
    return f"{cache_name} {version}" if version else cache_name


def open_corpus(cfg: CorpusConfig, tokenizer: Tokenizer, *, eos_policy: str, progress: bool = True):
    """{split: TokenFile}, preparing the cache first if needed; `verify_cache` (None: by size,
    True, False) says when the files' checksums are checked (token_cache.open_token_file)."""
    paths = prepare_corpus(cfg, tokenizer, eos_policy=eos_policy, progress=progress)
    rebuild = f"python scripts/prepare_data.py {cfg.name} (same overrides)"
    return {
        s: open_token_file(
            p,
            tokenizer=tokenizer.name,
            eos_policy=eos_policy,
            verify=cfg.verify_cache,
            rebuild=rebuild,
        )
        for s, p in paths.items()
    }


def prepared_summary(files: dict, tokenizer: Tokenizer) -> dict:
    """What prepare_data reports for a token cache: tokens and documents per split, where."""
    summary = {f"{split}_tokens": f.num_tokens for split, f in files.items()}
    summary |= {f"{split}_documents": f.num_docs for split, f in files.items()}
    return summary | {"tokenizer": tokenizer.name, "cache": str(files["train"].path.parent)}
