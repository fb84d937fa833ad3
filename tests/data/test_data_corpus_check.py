"""Local corpus files that `datasets` cannot read (a truncated .jsonl, files whose fields
differ, a damaged .csv / .parquet) are one ConfigError line naming the file and the line, on
the token-cache path and while streaming, not `datasets`' long traceback naming no file (issue
56, item 8). The expected line numbers are the test's own: it writes the files."""

from __future__ import annotations

import itertools
import json

import pytest
from data_testing import lm_config, write_jsonl

from flashtrain.data import build_data, prepare_data
from flashtrain.typed_config import ConfigError

DOCS = [{"text": f"document {i} " * 20} for i in range(12)]


def truncated_jsonl(path):
    """Twelve good lines, then a thirteenth cut in the middle of its string (a copy cut short)."""
    write_jsonl(path, DOCS)
    path.write_text(path.read_text() + json.dumps(DOCS[0])[:15])
    return path, 13


def other_fields(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", DOCS)
    second = write_jsonl(tmp_path / "b.jsonl", [d | {"source": "web"} for d in DOCS])
    return [str(first), str(second)]


def refusal(cfg, streaming: bool) -> str:
    """The one line that preparing (or streaming a few batches of) the corpus is refused with."""
    with pytest.raises(ConfigError) as error:
        if streaming:
            data = build_data(
                cfg | {"streaming": True}, seq_len=16, micro_batch_size=2, seed=0, eval_batches=1
            )
            list(itertools.islice(data.train_batches(), 200))
        else:
            prepare_data(cfg, progress=False)
    message = str(error.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("streaming", [False, True], ids=["token_cache", "streaming"])
def test_a_truncated_jsonl_is_named_with_its_line(tmp_path, streaming):
    path, line = truncated_jsonl(tmp_path / "docs.jsonl")
    cfg = lm_config(tmp_path, data_files=str(path), val_fraction=0.25)
    if streaming:  # held out from the start of the stream: the cut line is met while training
        cfg |= {"val_files": str(write_jsonl(tmp_path / "val.jsonl", DOCS[:4]))}
    message = refusal(cfg, streaming)
    assert f"data.data_files: {path} line {line} is not JSON" in message, message
    assert "truncated" in message


@pytest.mark.parametrize("streaming", [False, True], ids=["token_cache", "streaming"])
def test_files_with_other_fields_are_named_with_both_field_lists(tmp_path, streaming):
    first, second = other_fields(tmp_path)
    message = refusal(lm_config(tmp_path, data_files=[first, second]), streaming)
    assert f"{second} has the fields ['source', 'text'] but {first} has ['text']" in message


def test_a_line_that_is_not_an_object_and_a_field_of_another_kind_are_named(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", DOCS[:5])
    path.write_text(path.read_text() + "[1, 2]\n")
    message = refusal(lm_config(tmp_path, data_files=str(path)), streaming=False)
    assert f"{path} line 6 is a JSON list, not an object" in message, message
    first = write_jsonl(tmp_path / "a.jsonl", DOCS)
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": ["a list"]}] * 3)  # no cast to text
    message = refusal(lm_config(tmp_path, data_files=[str(first), str(second)]), streaming=False)
    assert f"{second} line 1: field 'text' holds a list where {first} line 1 holds a string" in message  # fmt: skip


def test_a_damaged_csv_or_parquet_is_named(tmp_path):
    rows = "".join(f'"document {i} words",{i}\n' for i in range(8))
    csv = tmp_path / "docs.csv"
    csv.write_text("text,id\n" + rows + '"an unclosed quote,9\n')
    message = refusal(lm_config(tmp_path, data_files=str(csv)), streaming=False)
    assert f"{csv} line 10 is not CSV" in message, message
    parquet = tmp_path / "docs.parquet"
    parquet.write_bytes(b"PAR1 cut short")
    message = refusal(lm_config(tmp_path, data_files=str(parquet)), streaming=False)
    assert f"{parquet} is not a readable parquet file" in message, message


def test_a_text_field_of_numbers_is_named_before_tokenizing(tmp_path):
    """Files `datasets` reads well, but whose text field holds numbers: one line naming the
    field, not an AttributeError from inside the tokenizer's map."""
    path = write_jsonl(
        tmp_path / "docs.jsonl", [{"text": i, "body": "words " * 5} for i in range(9)]
    )
    message = refusal(lm_config(tmp_path, data_files=str(path)), streaming=False)
    assert "data.text_field 'text' holds" in message and "not text" in message, message
