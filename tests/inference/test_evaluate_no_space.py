"""scripts/evaluate.py on a full disk or over quota (its report, or --data's token cache): exit 4
and one line naming the file, as train.py and prepare_data.py (flashtrain/no_space.py)."""

from __future__ import annotations

import errno
import os

import flashtrain.inference.evaluate_cli as evaluate_cli
from flashtrain.train.entry import EXIT_NO_SPACE


def test_a_full_disk_is_one_line_and_exit_4(tmp_path, monkeypatch, capsys):
    report = tmp_path / "eval" / "eval.json"

    def full_disk(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(report))

    monkeypatch.setattr(evaluate_cli, "run", full_disk)
    assert evaluate_cli.main([str(tmp_path), "--seq-len", "8", "--no-progress"]) == EXIT_NO_SPACE
    assert capsys.readouterr().err == (
        f"error: no space left on the device writing {report}; free space on {report.parent}, "
        "then run it again\n"
    )
