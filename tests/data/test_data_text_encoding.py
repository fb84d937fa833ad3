"""Local text files that are not UTF-8 (a Latin-1 or binary `.txt`) are refused before `datasets`
reads them, with one line naming the file, the byte offset and what to do (issue 32)."""

from __future__ import annotations

import pytest
from data_testing import lm_config, write_jsonl

from flashtrain.data import prepare_data
from flashtrain.data.text_encoding import check_utf8

LATIN1 = "a caf\u00e9 in Latin-1".encode("latin-1")  # \xe9 at byte 5: not UTF-8
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def corpus_with(tmp_path, name: str, raw: bytes, **overrides):
    cfg = lm_config(tmp_path, **overrides)
    bad = tmp_path / "corpus" / name
    bad.write_bytes(raw)
    return cfg, bad


@pytest.mark.parametrize(("raw", "offset"), [(LATIN1, 5), (PNG, 0)], ids=["latin-1", "binary"])
def test_a_file_that_is_not_utf8_is_refused_naming_it_and_the_offset(tmp_path, raw, offset):
    cfg, bad = corpus_with(tmp_path, "zz_bad.txt", raw)
    with pytest.raises(ValueError) as error:
        prepare_data(cfg, progress=False)
    message = str(error.value)
    assert str(bad) in message and f"byte {offset}" in message, message
    assert "not UTF-8" in message and "convert it to UTF-8" in message and "remove it" in message
    assert "\n" not in message


def test_json_lines_are_checked_too(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "caf\u00e9 " * 50}] * 4)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "' + LATIN1 + b'"}\n')
    cfg = lm_config(tmp_path, data_files=[str(good), str(bad)])
    with pytest.raises(ValueError, match=rf"{bad}.* byte 15 "):
        prepare_data(cfg, progress=False)


def test_the_offset_is_exact_across_read_chunks(tmp_path):
    path = tmp_path / "long.txt"
    # a 2-byte character cut by the first chunk boundary, then an invalid byte in a later chunk
    path.write_bytes(b"abcd\xc3\xa9efgh" + b"x" * 7 + b"\xff")
    with pytest.raises(ValueError, match=r"byte 17 \(0xff\)"):
        check_utf8(path, "data.data_files", chunk_bytes=5)
    path.write_bytes(b"abcd\xc3\xa9efgh\xc3")  # ends inside a character
    with pytest.raises(ValueError, match=r"byte 10 \(0xc3\).*incomplete character ends the file"):
        check_utf8(path, "data.data_files", chunk_bytes=5)
    path.write_bytes(b"abcd\xc3\xa9efgh")
    check_utf8(path, "data.data_files", chunk_bytes=5)


def test_prepare_data_command_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from flashtrain.lab.prepare_data import main

    bad = tmp_path / "bad.txt"
    bad.write_bytes(LATIN1)
    argv = ["prepare_data.py", "text_files", f"data_files={bad}", f"cache_dir={tmp_path / 'c'}"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and "not UTF-8" in err and len(err.splitlines()) == 1, err
