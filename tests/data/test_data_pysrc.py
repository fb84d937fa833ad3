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
