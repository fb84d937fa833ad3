"""What building a token cache leaves on disk: the cache's own files, none of `datasets`'
intermediate cache-*.arrow files (issue 56, item 16); and a build that a full disk or a spent
quota stops leaves nothing of itself and is one line naming the cache folder and data.cache_dir,
exit 4 from prepare_data.py as from train.py (item 7). The disk is filled where each write
happens, in this process: `datasets` converting the corpus, `datasets` tokenizing it, the token
file itself."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest
import yaml
from data_testing import lm_config
from datasets.arrow_writer import ArrowWriter
from refused_writes import refusing_open

import flashtrain.data.token_cache as token_cache
from flashtrain.data import prepare_data
from flashtrain.data.corpus import corpus_cache_dir
from flashtrain.data.registry import data_config
from flashtrain.data.tokenization import ByteTokenizer
from flashtrain.no_space import NoSpaceError

CACHE_FILES = ["spec.json", "train.bin", "validation.bin"]


def cache_dir(cfg) -> Path:
    return corpus_cache_dir(data_config(cfg), ByteTokenizer(), "append")


def leftovers(root: Path) -> list[str]:
    """Files under the cache root that are not a finished cache's, nor `datasets`' own copy of
    the source (its prepared dataset, which later builds reuse) and the locks."""
    kept = {"dataset_info.json", "text-train.arrow"}
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.name not in kept and not p.name.endswith(".lock")
    )


@pytest.mark.parametrize("num_proc", [None, 2])
def test_a_built_cache_leaves_only_its_own_files(tmp_path, num_proc):
    cfg = lm_config(tmp_path, num_proc=num_proc)  # validation carved: split indices too
    summary = prepare_data(cfg, progress=False)
    directory = cache_dir(cfg)
    assert sorted(p.name for p in directory.iterdir()) == CACHE_FILES
    root = tmp_path / "cache"
    assert leftovers(root) == sorted(str((directory / f).relative_to(root)) for f in CACHE_FILES)
    assert summary["train_documents"] + summary["validation_documents"] == 8


def fill_the_disk_at(monkeypatch, stage: str, code: int) -> None:
    """Make the write of `stage` fail as a full disk (ENOSPC) or a spent quota (EDQUOT) does,
    after writing part of what it was given."""
    refusal = OSError(code, os.strerror(code))
    if stage == "validation.bin":  # the token file, once train.bin is complete
        picked = lambda path: path.name.startswith(".validation.bin")
        monkeypatch.setattr(token_cache, "open", refusing_open(picked, code), raising=False)
        return
    column = {"converting": "text", "tokenizing": "ids"}[stage]
    real_write = ArrowWriter._write_table

    def write_table(self, table, *args, **kwargs):
        if column in table.column_names:
            raise refusal
        return real_write(self, table, *args, **kwargs)

    monkeypatch.setattr(ArrowWriter, "_write_table", write_table)


@pytest.mark.parametrize(
    ("stage", "code"),
    [
        ("converting", errno.ENOSPC),
        ("tokenizing", errno.ENOSPC),
        ("validation.bin", errno.ENOSPC),
        ("tokenizing", errno.EDQUOT),
    ],
)
def test_a_full_disk_while_building_is_one_line_and_leaves_nothing(
    tmp_path, monkeypatch, stage, code
):
    cfg = lm_config(tmp_path)
    root, directory = tmp_path / "cache", cache_dir(cfg)
    fill_the_disk_at(monkeypatch, stage, code)
    with pytest.raises(NoSpaceError) as refused:
        prepare_data(cfg, progress=False)
    advice = (
        f"free space in your disk quota on {root}"
        if code == errno.EDQUOT
        else f"free space on {root}"
    )
    shortage = "disk quota exceeded" if code == errno.EDQUOT else "no space left on the device"
    assert str(refused.value) == (
        f"{shortage} building the token cache {directory}: the partial files were removed; "
        f"{advice} (data.cache_dir), or set data.cache_dir to a folder on another disk"
    )
    assert not directory.exists() and leftovers(root) == []
    monkeypatch.undo()  # space again: the build is not blocked by anything the failure left
    prepare_data(cfg, progress=False)
    assert sorted(p.name for p in directory.iterdir()) == CACHE_FILES


def test_prepare_data_exits_4_with_the_line(tmp_path, monkeypatch, capsys):
    from flashtrain.lab.prepare_data import main

    config = tmp_path / "corpus.yaml"
    config.write_text(yaml.safe_dump(lm_config(tmp_path)))
    fill_the_disk_at(monkeypatch, "tokenizing", errno.ENOSPC)
    monkeypatch.setattr(sys, "argv", ["prepare_data.py", str(config)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 4
    err = capsys.readouterr().err  # the progress bars, then the line
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("NoSpaceError: no space left on the device ")
