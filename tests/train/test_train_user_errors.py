"""One behaviour for every error a user causes: one message, exit code 2, no traceback (the
traceback only with HYDRA_FULL_ERROR=1); a crash still prints its traceback and exits 1."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from config_testing import REPO, compose
from train_testing import HANG_GUARD_S, TINY, run_train, subprocess_env

from flashtrain.data import prepare_data
from flashtrain.train import main
from flashtrain.train.entry import EXIT_USER_ERROR


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a tiny corpus.\n\n" for i in range(200)))
    return corpus


def _missing_tokenizer(tmp_path, monkeypatch):
    for var in ("FLASHTRAIN_TOKENIZERS", "TIKTOKEN_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "nothing"))
    return ["data=openwebtext", f"data.cache_dir={tmp_path}"], "GPT-2 BPE files not found"


def _corrupt_cache(tmp_path, monkeypatch):
    over = [
        "data=text_files",
        f"data.data_files={_corpus(tmp_path)}",
        "data.sample_by=paragraph",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    prepare_data(compose(TINY + over).data, progress=False)
    (cache,) = [p for p in (tmp_path / "cache").rglob("train*") if p.is_file()]
    raw = bytearray(cache.read_bytes())
    raw[20] ^= 0xFF  # a header byte: its CRC no longer matches
    cache.write_bytes(bytes(raw))
    return over, "TokenCacheError"


def _bad_checkpoint(tmp_path, monkeypatch):
    folder = tmp_path / "not_a_checkpoint"
    folder.mkdir()
    (folder / "meta.json").write_text("{ truncated")
    return [f"trainer.resume={folder}"], f"checkpoint {folder} is corrupt: cannot read meta.json"


CASES = {
    "missing tokenizer files": _missing_tokenizer,
    "corrupt token cache": _corrupt_cache,
    "bad n_head": lambda *_: (["model.n_head=3"], "model.n_head=3 does not divide"),
    "unsupported head_dim": lambda *_: (
        ["model.n_head=1", "model.d_model=512"],
        "model: attention=flash needs head_dim",
    ),
    "negative lr": lambda *_: (["optim.lr=-0.001"], "optim.lr must be > 0, got -0.001"),
    "bad checkpoint": _bad_checkpoint,
    "unknown key": lambda *_: (["+trainer.max_step=3"], "unknown key 'trainer.max_step'"),
    # Refused while the trainer builds: the build's own error, not one from closing it after.
    "tokens not a multiple": lambda *_: (
        ["global_batch_tokens=1000", "global_batch_size=null"],
        "global_batch_tokens=1000 is not a multiple of seq_len",
    ),
    "context parallel in one process": lambda *_: (
        ["trainer.context_parallel=2"],
        "trainer.context_parallel=2 does not divide the world size 1",
    ),
    "fp16 on a CPU": lambda *_: (
        ["trainer.precision=fp16", "trainer.device=cpu"],
        "trainer.precision=fp16 needs a CUDA device",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_user_errors_end_with_one_message_and_exit_code_2(case, tmp_path, monkeypatch, caplog):
    overrides, message = CASES[case](tmp_path, monkeypatch)
    cfg = compose(TINY + ["trainer.max_steps=1", *overrides])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and message in errors[0].getMessage(), caplog.text
    assert errors[0].exc_info is None  # no traceback unless HYDRA_FULL_ERROR=1


@pytest.mark.slow  # ~24 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_the_command_shows_the_traceback_only_with_hydra_full_error(tmp_path):
    args = TINY + ["optim.lr=-1"]
    plain = run_train(args, cwd=tmp_path)
    full = run_train(args, cwd=tmp_path, env=subprocess_env(HYDRA_FULL_ERROR="1"))
    for res in (plain, full):
        assert res.returncode == EXIT_USER_ERROR, res.stderr[-2000:]
        assert "ConfigError: optim.lr must be > 0, got -1.0" in res.stdout + res.stderr
    assert "Traceback" not in plain.stdout + plain.stderr
    assert "Traceback" in full.stdout + full.stderr


def test_a_crash_prints_its_traceback_and_exits_1(tmp_path):
    """A bug is not a user error: Hydra reports it as usual (its traceback, exit code 1)."""
    crash = tmp_path / "crash.py"
    crash.write_text(
        "import runpy, sys\n"
        "import flashtrain.train.trainer as trainer\n"
        "def fit(self, on_step=None):\n"
        "    raise ValueError('a bug inside the loop')\n"
        "trainer.Trainer.fit = fit\n"
        f"sys.argv = [{str(REPO / 'train.py')!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')\n"
    )
    import subprocess

    res = subprocess.run(
        [sys.executable, str(crash), *TINY, "trainer.max_steps=1"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" in res.stderr and "ValueError: a bug inside the loop" in res.stderr
    assert "HYDRA_FULL_ERROR=1" in res.stderr  # Hydra's own report, pointing at the full one
    # ... and the run's log file has it too: a job's log is what is read after it died
    (log_file,) = tmp_path.glob("outputs/*/*/train.log")
    logged = log_file.read_text()
    assert "crashed: ValueError: a bug inside the loop" in logged and "Traceback" in logged
