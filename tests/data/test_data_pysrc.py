"""pysrc: the standard library as a corpus — which files count, the split, the version, stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashtrain.data import pysrc
from flashtrain.data.tokenization import ByteTokenizer

LONG = "x = 1\n" * 3000  # 18000 bytes: over 1K, 4K and 16K


def make_root(root: Path) -> Path:
    files = {
        "a.py": "import os\n",
        "pkg/__init__.py": "",
        "pkg/long.py": LONG,
        "pkg/medium.py": "y = 2\n" * 200,  # 1200 bytes
        "test/bad_syntax.py": "def f(:\n",
        "site-packages/third_party.py": "z = 3\n",
        "__pycache__/cached.py": "w = 4\n",
        "_sysconfigdata__linux_x86_64-linux-gnu.py": "build_time_vars = {}\n",
        "notes.txt": "not python\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "test" / "latin1.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    return root


def test_source_files_lists_candidates_and_load_keeps_parsable_utf8(tmp_path):
    root = make_root(tmp_path)
    listed = [f.path for f in pysrc.source_files(root)]
    assert listed == [
        "a.py",
        "pkg/__init__.py",
        "pkg/long.py",
        "pkg/medium.py",
        "test/bad_syntax.py",
        "test/latin1.py",
    ]
    assert pysrc.source_files(root)[2].size == len(LONG)
    splits = pysrc.load_pysrc(root, val_fraction=0.3, test_fraction=0.3)
    kept = sorted(p for s in pysrc.SPLITS for p in splits[s]["path"])
    assert kept == ["a.py", "pkg/__init__.py", "pkg/long.py", "pkg/medium.py"]
    for split in pysrc.SPLITS:
        for path, text in zip(splits[split]["path"], splits[split]["text"]):
            assert pysrc.split_of(path, 0.3, 0.3) == split
            assert text == (root / path).read_text()


def test_split_is_a_fixed_function_of_the_path():
    paths = [f"pkg{i % 7}/module_{i}.py" for i in range(6000)]
    first = [pysrc.split_of(p, 0.1, 0.2) for p in paths]
    assert first == [pysrc.split_of(p, 0.1, 0.2) for p in reversed(paths)][::-1]
    share = {s: first.count(s) / len(paths) for s in pysrc.SPLITS}
    assert abs(share["validation"] - 0.1) < 0.02 and abs(share["test"] - 0.2) < 0.02
    # Growing the validation fraction only moves files out of train.
    grown = [pysrc.split_of(p, 0.15, 0.2) for p in paths]
    moved = {(a, b) for a, b in zip(first, grown) if a != b}
    assert moved == {("train", "validation")}


@pytest.mark.parametrize("val, test", [(0.5, 0.5), (-0.1, 0.1), (0.1, 1.0)])
def test_bad_fractions_are_refused(val, test):
    with pytest.raises(ValueError, match="fraction"):
        pysrc.split_of("a.py", val, test)


def test_corpus_version_follows_the_file_list_and_sizes(tmp_path):
    root = make_root(tmp_path)
    version = pysrc.corpus_version(pysrc.source_files(root))
    assert version.startswith("python-3.") and version == pysrc.corpus_version(
        list(reversed(pysrc.source_files(root)))
    )
    (root / "a.py").write_text("import os, sys\n")
    grown = pysrc.corpus_version(pysrc.source_files(root))
    (root / "b.py").write_text("")
    added = pysrc.corpus_version(pysrc.source_files(root))
    assert len({version, grown, added}) == 3


def test_stats_count_files_bytes_tokens_and_long_files(tmp_path):
    root = make_root(tmp_path)
    splits = pysrc.load_pysrc(root, val_fraction=0.0, test_fraction=0.0)
    stats = pysrc.corpus_stats(splits, ByteTokenizer())
    train = stats["train"]
    sizes = [len("import os\n"), 0, len(LONG), 1200]
    assert train["files"] == 4 and stats["validation"]["files"] == 0
    assert train["mb"] == pytest.approx(sum(sizes) / 1e6)
    assert train["tokens"] == sum(sizes) + 4  # one <eos> per file
    assert (train["files_over_1k"], train["files_over_4k"], train["files_over_16k"]) == (2, 1, 1)
    assert stats["all"]["files"] == 4
    text = pysrc.format_stats(stats, "python-x", "byte-utf8")
    assert "| train | 4 |" in text and "> 16K bytes" in text


def test_the_running_pythons_library_is_listed():
    files = pysrc.source_files()
    paths = {f.path for f in files}
    assert {"os.py", "json/__init__.py"} <= paths
    assert not any("site-packages" in p or p.startswith("_sysconfigdata_") for p in paths)
    assert len(files) > 500


# --- the installed packages (data.pysrc_packages) -------------------------------------------


def make_package_roots(tmp_path: Path) -> tuple[Path, Path]:
    """Two package roots: the second repeats one of the first's paths with other text."""
    first, second = tmp_path / "site-a", tmp_path / "site-b"
    files = {
        first / "numpy/__init__.py": "from numpy.core import *\n",
        first / "numpy/core.py": "def add(a, b):\n    return a + b\n",
        first / "numpy/__pycache__/core.cpython-311.py": "cached = 1\n",
        first / "_sysconfigdata__linux_x86_64-linux-gnu.py": "build_time_vars = {}\n",
        first / "broken.py": "def f(:\n",
        first / "vendored/site-packages/inner.py": "inner = 1\n",  # not skipped by name here
        first / "README.txt": "not python\n",
        second / "numpy/core.py": "def add(a, b):\n    return b + a  # another copy\n",
        second / "six.py": "PY3 = True\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (first / "latin1.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    return first, second


@pytest.fixture
def stdlib_and_packages(tmp_path, monkeypatch):
    """(stdlib root, first package root, second package root), the roots pysrc finds."""
    root = make_root(tmp_path / "stdlib")
    first, second = make_package_roots(tmp_path)
    monkeypatch.setattr(pysrc, "stdlib_root", lambda: root)
    monkeypatch.setattr(pysrc, "package_roots", lambda stdlib=None: [first, second])
    return root, first, second


def todays_corpus_version(files) -> str:
    """corpus_version as it was before package files: the stdlib-only value must not move."""
    import hashlib
    import platform

    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.size}\n".encode())
    return f"python-{platform.python_version()}-{digest.hexdigest()[:12]}"


def test_package_files_are_packages_documents_and_the_first_root_wins(tmp_path):
    first, second = make_package_roots(tmp_path)
    files = pysrc.package_files([first, second], stdlib=tmp_path / "stdlib")
    assert [f.path for f in files] == [
        "packages/broken.py",
        "packages/latin1.py",
        "packages/numpy/__init__.py",
        "packages/numpy/core.py",
        "packages/six.py",
        "packages/vendored/site-packages/inner.py",
    ]
    core = next(f for f in files if f.path == "packages/numpy/core.py")
    assert (
        core.root == str(first.resolve()) and core.size == (first / "numpy/core.py").stat().st_size
    )
    assert core.location(tmp_path / "stdlib") == first.resolve() / "numpy/core.py"
    six = next(f for f in files if f.path == "packages/six.py")
    assert six.location(tmp_path) == second.resolve() / "six.py"


def test_package_roots_are_existing_distinct_and_never_read_twice(tmp_path):
    stdlib = tmp_path / "lib"
    for folder in ("lib/site-packages", "lib/vendor", "site-a/nested", "site-b"):
        (tmp_path / folder).mkdir(parents=True)
    candidates = [
        tmp_path / "site-a",
        tmp_path / "site-a/nested",  # inside a root already kept
        str(tmp_path / "site-b/../site-a"),  # the same folder, spelled otherwise
        tmp_path / "missing",
        stdlib / "vendor",  # the stdlib scan reads it already
        stdlib / "site-packages",  # the stdlib scan leaves it out: a root of its own
        tmp_path / "site-b",
    ]
    roots = pysrc.distinct_roots(candidates, stdlib)
    assert roots == [
        p.resolve() for p in (tmp_path / "site-a", stdlib / "site-packages", tmp_path / "site-b")
    ]


def test_a_root_holding_another_root_or_the_stdlib_does_not_read_them_again(tmp_path):
    outer = tmp_path / "outer"
    for name in ("outer/a.py", "outer/inner/b.py", "outer/lib/os.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    files = pysrc.package_files([outer / "inner", outer], stdlib=outer / "lib")
    assert [f.path for f in files] == ["packages/a.py", "packages/b.py"]


def test_the_corpus_with_packages_reads_them_split_by_document_path(stdlib_and_packages):
    root, first, second = stdlib_and_packages
    stdlib_only = pysrc.corpus_files()
    assert stdlib_only == pysrc.source_files(root)
    files = pysrc.corpus_files(packages=True)
    assert [f.path for f in files] == sorted(f.path for f in files)
    assert {f.path for f in files} - {f.path for f in stdlib_only} == {
        f.path for f in pysrc.package_files([first, second])
    }
    splits = pysrc.load_pysrc(None, 0.3, 0.3, files=files)
    documents = {p: t for s in pysrc.SPLITS for p, t in zip(splits[s]["path"], splits[s]["text"])}
    assert sorted(p for p in documents if p.startswith("packages/")) == [
        "packages/numpy/__init__.py",
        "packages/numpy/core.py",
        "packages/six.py",
        "packages/vendored/site-packages/inner.py",
    ]  # broken.py (syntax) and latin1.py (not UTF-8) are no source
    assert documents["packages/numpy/core.py"] == (first / "numpy/core.py").read_text()
    assert documents["packages/six.py"] == (second / "six.py").read_text()
    for split in pysrc.SPLITS:
        assert all(pysrc.split_of(p, 0.3, 0.3) == split for p in splits[split]["path"])


def test_corpus_version_moves_with_packages_and_not_without(stdlib_and_packages):
    stdlib_only = pysrc.corpus_files()
    version = pysrc.corpus_version(stdlib_only)
    assert version == todays_corpus_version(stdlib_only)
    assert pysrc.corpus_version(pysrc.corpus_files(packages=True)) != version


def test_a_stdlib_packages_folder_would_clash_and_is_refused(stdlib_and_packages):
    root = stdlib_and_packages[0]
    (root / "packages").mkdir()
    (root / "packages/own.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="pysrc_packages=false"):
        pysrc.corpus_files(packages=True)


def test_reading_in_two_processes_gives_the_same_dataset(stdlib_and_packages):
    files = pysrc.corpus_files(packages=True)
    one = pysrc.load_pysrc(None, 0.3, 0.3, files=files)
    two = pysrc.load_pysrc(None, 0.3, 0.3, files=files, num_proc=2)
    for split in pysrc.SPLITS:
        assert one[split].to_list() == two[split].to_list()
    assert sum(len(one[s]) for s in pysrc.SPLITS) == 8
    with pytest.raises(ValueError, match="num_proc must be >= 1"):
        pysrc.load_pysrc(None, 0.3, 0.3, files=files, num_proc=0)


@pytest.mark.parametrize("error", [RecursionError, MemoryError])
def test_a_file_past_the_parsers_limits_is_no_source(tmp_path, monkeypatch, error):
    import ast
    import gc

    root = make_root(tmp_path)
    parse = ast.parse

    def parse_but_not_long(text, filename="<unknown>", **kwargs):
        if filename.endswith("long.py"):
            raise error("too deep for the parser")
        return parse(text, filename, **kwargs)

    monkeypatch.setattr(ast, "parse", parse_but_not_long)
    assert pysrc.read_source(root / "pkg/long.py") is None
    assert gc.isenabled()  # the collector, off while parsing, is back on after the error
    splits = pysrc.load_pysrc(root, val_fraction=0.0, test_fraction=0.0)
    assert splits["train"]["path"] == ["a.py", "pkg/__init__.py", "pkg/medium.py"]


def test_this_pythons_package_roots_are_found():
    roots = pysrc.package_roots()
    assert roots and all(root.is_dir() for root in roots)
    assert any((root / "_pytest").is_dir() for root in roots)  # this test runs under pytest
