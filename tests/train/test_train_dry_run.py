"""trainer.max_steps=0 is a dry run: the model (built on the meta device), its parameter count,
FLOPs per token and the batch plan are printed before any data is touched, and the run exits 0
on a machine without the data (no tokenizer files, no token cache, no Pathfinder images)."""

from __future__ import annotations

import logging

import pytest
from config_testing import compose
from train_testing import run_train, subprocess_env

from flashtrain.train import ConfigError, main, run
from flashtrain.train.entry import EXIT_USER_ERROR


@pytest.fixture
def no_data_here(tmp_path, monkeypatch):
    """Every place data, tokenizers or caches are looked up is an empty folder under tmp_path."""
    for var, folder in (
        ("FLASHTRAIN_DATA", "data"),
        ("FLASHTRAIN_TOKENIZERS", "tokenizers"),
        ("TIKTOKEN_CACHE_DIR", "tiktoken"),
        ("HF_HOME", "hf"),
    ):
        monkeypatch.setenv(var, str(tmp_path / folder))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("preset", ["owt/gpt2s-1k", "bert/large-512", "pathx/flash"])
def test_dry_run_of_a_preset_touches_no_data(preset, no_data_here, caplog):
    caplog.set_level("INFO", logger="flashtrain")
    cfg = compose([f"experiment={preset}", "trainer.max_steps=0", "logger=none"])
    out = run(cfg, no_data_here / "run")
    assert out["step"] == 0 and out["params"] > 100_000
    text = caplog.text
    for piece in (f"\nparams: {out['params']}\n", "flops/token: ", "batch: ", "(blocks): "):
        assert piece in text, piece  # the count, FLOPs, the plan and the printed model
    assert "no data" in text
    made = sorted(p.name for p in no_data_here.iterdir())
    assert made == [], made  # no cache, no tokenizer folder, no run directory, no images


@pytest.mark.slow  # ~11 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_dry_run_command_exits_0_without_tokenizer_files(no_data_here):
    res = run_train(
        ["experiment=owt/gpt2s-1k", "trainer.max_steps=0", "logger=none"],
        cwd=no_data_here,
        env=subprocess_env(
            FLASHTRAIN_DATA=str(no_data_here / "data"),
            FLASHTRAIN_TOKENIZERS=str(no_data_here / "tokenizers"),
            TIKTOKEN_CACHE_DIR=str(no_data_here / "tiktoken"),
        ),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "params: 124475904" in res.stdout and "Traceback" not in res.stderr
    assert "batch: 512 seqs x 1024 = 524.29K tokens/step = micro 16 x 1 ranks x 32" in res.stdout


# Refusals that the config alone decides: a dry run makes them too, so a real run makes them
# before it tokenizes a corpus or generates images.
CONFIG_ONLY_REFUSALS = {
    "document masking needs flash": (
        ["data=openwebtext", "attention=sdpa"],
        "data.document_masking=true needs attention=flash",
    ),
    "hybrid context parallelism needs its Ulysses size": (
        ["trainer.context_parallel=2", "trainer.context_parallel_mode=hybrid"],
        "needs trainer.ulysses_size",
    ),
    "model vocabulary too small": (
        ["data=synthetic", "model.vocab_size=10"],
        "has 16 token ids but the model's vocab_size is 10",
    ),
}


@pytest.mark.parametrize("case", CONFIG_ONLY_REFUSALS)
def test_config_only_refusals_happen_in_a_dry_run(case, no_data_here):
    overrides, message = CONFIG_ONLY_REFUSALS[case]
    cfg = compose(["model=gpt2-tiny", "logger=none", "trainer.max_steps=0", *overrides])
    with pytest.raises(ConfigError, match=message):
        run(cfg, no_data_here / "run")
    assert sorted(p.name for p in no_data_here.iterdir()) == []


# The model must train on the data's task (each model config's `task` against the loader class's):
# refused from the config, naming both and what would fit, before any image or cache is made.
TASK_MISMATCHES = {
    "classification data, GPT-2": (
        ["model=gpt2-tiny", "data=pathfinder32"],
        "data 'pathfinder32' (PathfinderClassification) gives classification batches, but "
        "model.arch=gpt2 trains on lm batches; for classification data use model.arch=bert "
        "with model.head=classification or model.arch=classifier",
    ),
    "mlm data, GPT-2": (
        ["model=gpt2-tiny", "data=pysrc_mlm"],
        "data 'pysrc_mlm' (MaskedLM) gives mlm batches, but model.arch=gpt2 trains on lm "
        "batches; for mlm data use model.arch=bert with model.head=mlm",
    ),
    "lm data, BERT": (
        ["model=bert-base", "data=pysrc"],
        "data 'pysrc' (TokenCacheLM) gives lm batches, but model.arch=bert with model.head=mlm "
        "trains on mlm batches; for lm data use model.arch=gpt2 or model.arch=llama",
    ),
}


@pytest.mark.parametrize("steps", [0, 1], ids=["dry run", "real run"])
@pytest.mark.parametrize("case", TASK_MISMATCHES)
def test_a_model_of_another_task_than_the_data_is_refused_before_any_data(
    case, steps, no_data_here
):
    overrides, message = TASK_MISMATCHES[case]
    cfg = compose(["logger=none", "seq_len=1024", f"trainer.max_steps={steps}", *overrides])
    with pytest.raises(ConfigError) as refused:
        run(cfg, no_data_here / "run")
    assert str(refused.value) == message
    assert sorted(p.name for p in no_data_here.iterdir()) == []  # no images, no cache, no run dir


def _blocker(tmp_path) -> str:
    """A file where a folder should be."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    return str(blocker)


# Refused at start by a dry run and a real run alike (the config's validation, or the start
# check of the data's source and the folders the run writes): one line, exit 2, before the
# model is built, so nothing is summarised and nothing made.
START_REFUSALS = {
    "Pathfinder contour too long for its images": lambda tmp: (
        ["model=pathx-classifier", "data=pathfinder32", "seq_len=1024", "data.contour_length=60"],
        "data.contour_length=60 does not fit a 32x32 image: allowed are 2 to 21 paddles there",
    ),
    "Pathfinder seq_len not the image's": lambda tmp: (
        ["model=pathx-classifier", "data=pathfinder32", "seq_len=4096"],
        "pathfinder32 images are 32x32 = 1024 tokens; set seq_len=1024 (got 4096)",
    ),
    "BERT pairs too short": lambda tmp: (
        ["model=bert-base", "data=pysrc_mlm", "seq_len=4"],
        "seq_len=4 leaves no room for the masked-LM pairs [CLS] A [SEP] B [SEP] of data "
        "'pysrc_mlm': seq_len must be >= 5",
    ),
    "BERT preset of another seq_len": lambda tmp: (
        ["model=bert-base", "data=pysrc_mlm", "data.preset=mlperf", "seq_len=128"],
        "data.preset=mlperf needs seq_len=512, got 128",
    ),
    "synthetic validation of no size": lambda tmp: (
        ["model=gpt2-tiny", "data=synthetic", "trainer.eval_batches=null"],
        "set trainer.eval_batches (validation batches per rank) to a number",
    ),
    "a corpus without a source": lambda tmp: (
        ["model=gpt2-tiny", "data=text_files"],
        "data config 'text_files' names no source",
    ),
    "long documents from the hub": lambda tmp: (
        ["model=bert-base", "model.head=classification", "data=long_doc", "data.hub_name=a/b"],
        "data config 'long_doc' needs `data_files`: local .jsonl or .csv files",
    ),
    "logger.dir below a file": lambda tmp: (
        ["model=gpt2-tiny", "data=synthetic", "logger=wandb", f"logger.dir={_blocker(tmp)}/w"],
        f"logger.dir {tmp}/blocker/w is not a directory (a file is in the way): logger=wandb's "
        "files need a folder this run can create and write; point logger.dir at one",
    ),
    "trainer.ckpt_dir below a file": lambda tmp: (
        ["model=gpt2-tiny", "data=synthetic", f"trainer.ckpt_dir={_blocker(tmp)}/c"],
        f"trainer.ckpt_dir {tmp}/blocker/c is not a directory (a file is in the way)",
    ),
}


@pytest.mark.parametrize("steps", [0, 1], ids=["dry run", "real run"])
@pytest.mark.parametrize("case", START_REFUSALS)
def test_what_the_settings_rule_out_is_refused_at_start(case, steps, no_data_here, caplog):
    caplog.set_level("INFO", logger="flashtrain")
    overrides, message = START_REFUSALS[case](no_data_here)
    cfg = compose([f"trainer.max_steps={steps}", *overrides])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and message in errors[0], errors
    assert "params: " not in caplog.text  # refused before the model was built and summarised
    assert sorted(p.name for p in no_data_here.iterdir()) in ([], ["blocker"])
