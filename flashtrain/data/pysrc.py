"""pysrc: the running Python's standard library as a text corpus that every machine has.

Tens of MB of real code that nobody in this project wrote, with many files far longer than a
short context, so a language model should gain from a longer one. Pure functions (no config):

    stdlib_root()                          the sysconfig 'stdlib' folder
    source_files(root)                     [SourceFile(path, size)]: the .py files, sorted
    corpus_version(files)                  "python-3.11.7-<hash of the file list and sizes>"
    split_of(path, val_fraction, test_fraction)   "train" | "validation" | "test"
    load_pysrc(root, val_fraction, test_fraction)  DatasetDict of {path, text} documents
    corpus_stats(splits, tokenizer)        files, MB, tokens per split, long-file counts

What counts as source: a `.py` file outside site-packages and __pycache__, that is UTF-8 and
parses as Python under the running interpreter. That leaves out the test suite's deliberately
broken samples (bad encodings, bad syntax) and build-generated `_sysconfigdata_*` modules.
A document is one file: its path relative to the stdlib root and its text. The split of a file
depends only on a hash of that path, so it is the same on every machine and stays put when other
files come or go.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import sysconfig
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")
LONG_FILE_BYTES = (1024, 4096, 16384)  # the corpus statistics count files longer than these


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, "/"-separated
    size: int  # bytes


def stdlib_root() -> Path:
    """The folder of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _candidate(relative: Path) -> bool:
    if any(part in EXCLUDED_DIRS for part in relative.parts):
        return False
    return not relative.name.startswith("_sysconfigdata_")  # written by the build, per machine


def source_files(root: Path | None = None) -> list[SourceFile]:
    """Every candidate .py file under root (sorted by path), from file names and sizes alone.
    The UTF-8 and syntax checks happen when the text is read (load_pysrc)."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"pysrc: the standard-library folder {root} does not exist")
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if path.is_file() and _candidate(relative):
            files.append(SourceFile(relative.as_posix(), path.stat().st_size))
    return sorted(files, key=lambda f: f.path)


def corpus_version(files: Sequence[SourceFile]) -> str:
    """The Python version and a hash of the sorted (path, size) list: a token cache built from
    another interpreter's library carries another version and is not mistaken for this one."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.size}\n".encode())
    return f"python-{platform.python_version()}-{digest.hexdigest()[:12]}"


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (0.0 <= val_fraction < 1.0 and 0.0 <= test_fraction < 1.0):
        raise ValueError(
            f"pysrc split fractions must be in [0, 1): val_fraction={val_fraction}, "
            f"test_fraction={test_fraction}"
        )
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"pysrc val_fraction + test_fraction must be < 1 (training needs files), got "
            f"{val_fraction} + {test_fraction}"
        )


def split_of(path: str, val_fraction: float = 0.05, test_fraction: float = 0.05) -> str:
    """The split of a file, from the SHA-256 of its relative path read as a number in [0, 1)."""
    _check_fractions(val_fraction, test_fraction)
    u = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "validation"
    return "train"


def read_source(path: Path) -> str | None:
    """The file's text when it is UTF-8 Python source that parses here, else None."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        with warnings.catch_warnings():  # old escape sequences in the library warn; still source
            warnings.simplefilter("ignore")
            ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
        return None
    return text


def load_pysrc(
    root: Path | None = None,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    files: Sequence[SourceFile] | None = None,
):
    """`datasets.DatasetDict` with train / validation / test `Dataset`s of {path, text}, one row
    per source file, in path order. files: the listing to read (default source_files(root))."""
    from datasets import Dataset, DatasetDict, Features, Value

    _check_fractions(val_fraction, test_fraction)
    root = Path(root) if root is not None else stdlib_root()
    files = source_files(root) if files is None else files
    columns: dict[str, dict[str, list[str]]] = {s: {"path": [], "text": []} for s in SPLITS}
    for f in files:
        text = read_source(root / f.path)
        if text is None:
            continue
        split = columns[split_of(f.path, val_fraction, test_fraction)]
        split["path"].append(f.path)
        split["text"].append(text)
    features = Features({"path": Value("string"), "text": Value("string")})
    return DatasetDict(
        {s: Dataset.from_dict(columns[s], features=features) for s in SPLITS},
    )


def corpus_stats(splits, tokenizer=None) -> dict:
    """What the corpus holds: per split the files, MB (10^6 bytes of UTF-8), tokens (when a
    tokenizer is given: its ids plus one end-of-document token per file, as the token cache
    stores them) and how many files are longer than 1K / 4K / 16K bytes; "all" sums them."""
    stats: dict[str, dict] = {}
    for name, dataset in splits.items():
        sizes = [len(text.encode("utf-8")) for text in dataset["text"]]
        entry = {"files": len(sizes), "mb": sum(sizes) / 1e6}
        for limit in LONG_FILE_BYTES:
            entry[f"files_over_{limit // 1024}k"] = sum(s > limit for s in sizes)
        if tokenizer is not None:
            eos = 1 if tokenizer.eos_id is not None else 0
            ids = tokenizer.encode_batch(dataset["text"])
            entry["tokens"] = sum(len(doc) + eos for doc in ids)
        stats[name] = entry
    stats["all"] = {key: sum(entry[key] for entry in stats.values()) for key in entry}
    return stats


def format_stats(stats: dict, version: str, tokenizer_name: str | None) -> str:
    """The statistics as a markdown table."""
    counts = [f"> {limit // 1024}K bytes" for limit in LONG_FILE_BYTES]
    tokens = [f"tokens ({tokenizer_name})"] if tokenizer_name else []
    header = ["split", "files", "MB", *tokens, *counts]
    lines = [
        f"pysrc corpus {version}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, entry in stats.items():
        cells = [name, str(entry["files"]), f"{entry['mb']:.2f}"]
        cells += [f"{entry['tokens']:,}"] if tokenizer_name else []
        cells += [str(entry[f"files_over_{limit // 1024}k"]) for limit in LONG_FILE_BYTES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """`python -m flashtrain.data.pysrc [--tokenizer byte|gpt2]`: print the corpus statistics."""
    import argparse

    from flashtrain.data.tokenization import ByteTokenizer, load_gpt2

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--test-fraction", type=float, default=0.05)
    args = parser.parse_args(argv)
    files = source_files()
    splits = load_pysrc(None, args.val_fraction, args.test_fraction, files=files)
    tokenizer = ByteTokenizer() if args.tokenizer == "byte" else load_gpt2()
    stats = corpus_stats(splits, tokenizer)
    print(format_stats(stats, corpus_version(files), tokenizer.name), end="")


if __name__ == "__main__":
    main()
