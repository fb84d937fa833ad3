"""pysrc: the running Python's standard library as a text corpus that every machine has, and
optionally the source of its installed packages too.

Tens of MB of real code that nobody in this project wrote, with many files far longer than a
short context, so a language model should gain from a longer one. A GPU machine's site-packages
(torch, triton, numpy...) add hundreds of MB more: `data.pysrc_packages=true`. Pure functions
(no config):

    stdlib_root()                          the sysconfig 'stdlib' folder
    source_files(root)                     [SourceFile(path, size)]: the .py files, sorted
    package_roots()                        site-packages / dist-packages folders of this Python
    package_files(roots)                   [SourceFile("packages/<path>", size, root)], sorted
    corpus_files(root, packages)           the stdlib files, plus the package files if asked
    corpus_version(files)                  "python-3.11.7-<hash of the file list and sizes>"
    split_of(path, val_fraction, test_fraction)   "train" | "validation" | "test"
    load_pysrc(root, val_fraction, test_fraction, files, num_proc)  DatasetDict of {path, text}
    corpus_stats(splits, tokenizer)        files, MB, tokens per split, long-file counts

What counts as source: a `.py` file outside site-packages and __pycache__, that is UTF-8 and
parses as Python under the running interpreter. That leaves out the test suite's deliberately
broken samples (bad encodings, bad syntax) and build-generated `_sysconfigdata_*` modules.
A document is one file: its path relative to the stdlib root and its text. The split of a file
depends only on a hash of that path, so it is the same on every machine and stays put when other
files come or go.

With packages, every .py file under each package root (bar __pycache__ and `_sysconfigdata_*`)
is a candidate too, under the document path "packages/<path relative to its package root>"
(the first root wins when two hold the same path); the same UTF-8 and syntax checks apply.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import multiprocessing
import os
import platform
import site
import sysconfig
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")
PACKAGES = "packages"  # the document-path folder of package files: "packages/numpy/..."
LONG_FILE_BYTES = (1024, 4096, 16384)  # the corpus statistics count files longer than these


@dataclass(frozen=True)
class SourceFile:
    path: str  # the document path, "/"-separated: relative to the stdlib root, or for a package
    # file "packages/<path relative to its package root>"
    size: int  # bytes
    root: str = ""  # a package file's package root; "" for a standard-library file

    def location(self, stdlib: Path) -> Path:
        """Where the file lies: under its package root, else under the given stdlib root."""
        if self.root:
            return Path(self.root) / self.path.removeprefix(PACKAGES + "/")
        return stdlib / self.path


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


def package_roots(stdlib: Path | None = None) -> list[Path]:
    """This Python's package folders: site.getsitepackages(), then sysconfig's purelib and
    platlib; resolved, existing, each once, in that order (see distinct_roots)."""
    candidates = [*site.getsitepackages()]
    paths = sysconfig.get_paths()
    candidates += [paths["purelib"], paths["platlib"]]
    return distinct_roots(candidates, stdlib if stdlib is not None else stdlib_root())


def distinct_roots(candidates: Sequence[str | Path], stdlib: Path) -> list[Path]:
    """The existing folders among candidates, resolved, in order, leaving out a repeat, one inside
    a folder already kept, and one that the stdlib scan already reads (inside the stdlib root with
    no site-packages / dist-packages part): no file is listed twice."""
    stdlib = Path(stdlib).resolve()
    kept: list[Path] = []
    for candidate in candidates:
        root = Path(candidate).resolve()
        if not root.is_dir() or any(root.is_relative_to(k) for k in kept):
            continue
        if root.is_relative_to(stdlib) and _candidate(root.relative_to(stdlib)):
            continue
        kept.append(root)
    return kept


def package_files(
    roots: Sequence[Path] | None = None, stdlib: Path | None = None
) -> list[SourceFile]:
    """Every candidate .py file under the package roots (default package_roots(stdlib)), as
    documents "packages/<path relative to its root>", sorted by path; the first root wins a
    shared path. stdlib: the stdlib root (default stdlib_root()), never read here."""
    stdlib = Path(stdlib) if stdlib is not None else stdlib_root()
    roots = [Path(r).resolve() for r in (package_roots(stdlib) if roots is None else roots)]
    for root in roots:
        if not root.is_dir():
            raise FileNotFoundError(f"pysrc: the package folder {root} does not exist")
    # A root inside another one, or the stdlib inside a root, is read once: by its own scan.
    nested = {*roots, stdlib.resolve()}
    files: dict[str, SourceFile] = {}
    for root in roots:
        for relative, size in _package_sources(root, nested - {root}):
            path = f"{PACKAGES}/{relative}"
            files.setdefault(path, SourceFile(path, size, str(root)))
    return sorted(files.values(), key=lambda f: f.path)


def _package_sources(root: Path, skip: set[Path]):
    """(relative path, size) of the .py files under root, not descending into __pycache__ or the
    folders in skip; symlinked folders are not followed (os.walk), as in the stdlib scan."""
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and Path(folder, d) not in skip]
        for name in names:
            path = Path(folder, name)
            if name.endswith(".py") and not name.startswith("_sysconfigdata_") and path.is_file():
                yield path.relative_to(root).as_posix(), path.stat().st_size


def corpus_files(root: Path | None = None, packages: bool = False) -> list[SourceFile]:
    """The corpus listing, sorted by document path: the stdlib files under root (default
    stdlib_root()), and with packages the package files too (package_files())."""
    root = Path(root) if root is not None else stdlib_root()
    files = source_files(root)
    if not packages:
        return files
    clash = [f.path for f in files if f.path.startswith(PACKAGES + "/")]
    if clash:  # never in a real library; it would mix its files with the packages' documents
        raise ValueError(
            f"pysrc: the stdlib folder {root} has its own '{PACKAGES}/' folder ({clash[0]}), "
            "whose document paths would clash with the package files'; use "
            "data.pysrc_packages=false"
        )
    return sorted([*files, *package_files(stdlib=root)], key=lambda f: f.path)


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


@contextlib.contextmanager
def _no_cyclic_gc():
    """The cyclic garbage collector off for a while, then as it was. ast.parse makes millions of
    short-lived nodes, and each collection they trigger walks every object of the process: with
    `datasets` imported, that halves the parsing speed. The nodes hold no cycles, so reference
    counting alone frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_source(path: Path) -> str | None:
    """The file's text when it is UTF-8 Python source that parses here, else None."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        with warnings.catch_warnings(), _no_cyclic_gc():
            warnings.simplefilter(
                "ignore"
            )  # old escape sequences in the library warn; still source
            ast.parse(text, filename=str(path))
    # ValueError: a NUL byte in the text; RecursionError / MemoryError: a generated file nested
    # or sized past what the parser takes. None of them trains a model of Python source.
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return text


def read_sources(paths: Sequence[Path], num_proc: int | None = None) -> list[str | None]:
    """read_source of every path, in order; with num_proc > 1 in that many processes (reading
    and parsing run at ~7 MB/s per process)."""
    if not num_proc or num_proc <= 1 or len(paths) < 2:
        return [read_source(p) for p in paths]
    processes = min(num_proc, len(paths))
    # Many chunks per process: the listing is sorted, so the heavy files (a big package's) come
    # together and few large chunks would leave one process the long tail. Tens of files per
    # chunk still cost far less to send than to parse.
    chunksize = max(1, len(paths) // (processes * 32))
    with multiprocessing.get_context().Pool(processes) as pool:
        return pool.map(read_source, paths, chunksize=chunksize)


def load_pysrc(
    root: Path | None = None,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    files: Sequence[SourceFile] | None = None,
    num_proc: int | None = None,
):
    """`datasets.DatasetDict` with train / validation / test `Dataset`s of {path, text}, one row
    per source file, in the order of files. root: the stdlib root; files: the listing to read
    (default source_files(root)); num_proc: reading processes (the result does not depend on it)."""
    from datasets import Dataset, DatasetDict, Features, Value

    _check_fractions(val_fraction, test_fraction)
    if num_proc is not None and num_proc < 1:
        raise ValueError(f"pysrc num_proc must be >= 1 or None (one process), got {num_proc}")
    root = Path(root) if root is not None else stdlib_root()
    files = source_files(root) if files is None else files
    texts = read_sources([f.location(root) for f in files], num_proc)
    columns: dict[str, dict[str, list[str]]] = {s: {"path": [], "text": []} for s in SPLITS}
    for f, text in zip(files, texts):
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
    """`python -m flashtrain.data.pysrc [--tokenizer byte|gpt2] [--packages] [--num-proc N]`:
    print the corpus statistics."""
    import argparse

    from flashtrain.data.tokenization import ByteTokenizer, load_gpt2

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--test-fraction", type=float, default=0.05)
    parser.add_argument(
        "--packages", action="store_true", help="also the installed packages' .py files"
    )
    parser.add_argument("--num-proc", type=int, default=None, help="reading processes")
    args = parser.parse_args(argv)
    files = corpus_files(packages=args.packages)
    if args.packages:
        print("package roots: " + ", ".join(map(str, package_roots())) + "\n")
    splits = load_pysrc(
        None, args.val_fraction, args.test_fraction, files=files, num_proc=args.num_proc
    )
    tokenizer = ByteTokenizer() if args.tokenizer == "byte" else load_gpt2()
    stats = corpus_stats(splits, tokenizer)
    print(format_stats(stats, corpus_version(files), tokenizer.name), end="")


if __name__ == "__main__":
    main()
