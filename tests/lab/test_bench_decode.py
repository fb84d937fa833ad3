"""The decode benchmark (flashtrain.lab.bench.decode): on a CPU only that every method runs and
they agree; the timings need a GPU."""

import json

import pytest
import torch

from flashtrain.lab.bench.decode import METHODS, decode_rows, main


@pytest.mark.slow  # ~11 s; the command's test below runs every method at one length
def test_decode_rows_measure_every_method_per_cache_length():
    rows = decode_rows([40, 97], batch=2, heads_q=4, heads_kv=2, head_dim=16,
                       dtype=torch.float32, device=torch.device("cpu"), repeats=1)  # fmt: skip
    assert [(r["cache_len"], r["method"]) for r in rows] == [
        (n, m) for n in (40, 97) for m in METHODS
    ]
    assert all(r["seconds"] > 0 and r["max_abs_diff_vs_kvcache"] < 1e-5 for r in rows)


def test_command_writes_json_and_markdown_naming_the_setup(tmp_path):
    assert main(["--cache-lens", "40", "--repeats", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "decode.json").read_text())
    assert [r["method"] for r in report["rows"]] == list(METHODS)
    assert all(r["max_abs_diff_vs_kvcache"] < 1e-5 for r in report["rows"])  # they agree
    assert report["env"]["commit"] and "timings not meaningful" in report["env"]["device"]
    assert "| 40 | kvcache |" in (tmp_path / "decode.md").read_text()
