"""Small corpora and vocabularies that the data tests write for themselves (no downloads)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the quick brown fox jumps over lazy dog and runs far away from home into forest".split()


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_text_corpus(directory: Path, docs: int = 8, seed: int = 0) -> list[str]:
    """One .txt file per document; returns the documents in file order."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    texts = [random_text(rng, 150 + 40 * i) for i in range(docs)]
    for i, text in enumerate(texts):
        (directory / f"doc{i:02d}.txt").write_text(text)
    return texts


def write_python_sources(root: Path, files: int = 8, seed: int = 0) -> dict[str, str]:
    """A tiny stand-in for the standard library: .py files of small functions (one comment
    with non-ASCII bytes per file), at the top and in a package. Returns {relative path: text}."""
    rng = random.Random(seed)
    sources = {}
    for i in range(files):
        lines = [f"# {random_text(rng, 6)} naïve café", ""]
        for j in range(4 + 2 * i):
            name, arg = rng.sample(WORDS, 2)
            lines += [
                f"def {name}_{j}({arg}_value, limit={j}):",
                f'    """{random_text(rng, 8).capitalize()}."""',
                f"    return [{arg}_value] * limit",
                "",
            ]
        path = f"pkg/mod{i:02d}.py" if i % 2 else f"mod{i:02d}.py"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("\n".join(lines), encoding="utf-8")
        sources[path] = "\n".join(lines)
    return sources


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_wordpiece_vocab(path: Path) -> list[str]:
    """A tiny BERT vocabulary: specials, the corpus words, and a few ## pieces."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["##es", "##s", "."]
    path.write_text("\n".join(vocab) + "\n")
    return vocab


def lm_config(tmp_path: Path, **overrides) -> dict:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_text_corpus(corpus)
    cfg = {
        "loader": "lm_corpus",
        "name": "text_files",
        "data_files": str(corpus / "*.txt"),
        "cache_dir": str(tmp_path / "cache"),
        "val_fraction": 0.25,
        "tokenizer": "byte",
        "vocab_size": 258,
    }
    return cfg | overrides
