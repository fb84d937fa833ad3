"""The config tree: defaults, every preset, validation of keys and types, batch arithmetic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from config_testing import CONFIGS, compose, group_options
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from train_testing import run_train

from flashtrain.models import GPT2Config
from flashtrain.train import ConfigError, TrainConfig, batch_plan, run, validate_config
from flashtrain.train.entry import composition_error_message

PRESETS = group_options("experiment")


def test_the_preset_list_covers_the_papers_runs():
    for name in (
        "owt/gpt2s-1k",
        "owt/gpt2s-2k",
        "owt/gpt2s-4k",
        "owt/gpt2s-8k",
        "owt/gpt2s-16k",
        "pathx/flash",
        "pathx/blocksparse",
        "path256/blocksparse",
        "bert/large-512",
        "cpu/tiny",
    ):
        assert name in PRESETS
    for name in PRESETS:
        first = (CONFIGS / "experiment" / f"{name}.yaml").read_text().splitlines()
        assert "# @package _global_" in first[:3], name


def test_defaults():
    cfg = validate_config(compose())
    assert isinstance(cfg, TrainConfig) and isinstance(cfg.model, GPT2Config)
    assert (cfg.model.n_layer, cfg.model.d_model) == (2, 128)  # gpt2-tiny
    assert cfg.data.name == "synthetic" and cfg.attention.impl == "flash"
    assert cfg.logger.name == "wandb" and cfg.logger.mode is None  # $WANDB_MODE, else offline
    assert cfg.model.max_seq_len == cfg.seq_len  # interpolated from the top level
    assert cfg.model.vocab_size == cfg.data.vocab_size


def test_only_rank0_gets_a_hydra_run_dir(monkeypatch):
    raw = OmegaConf.merge(
        OmegaConf.load(CONFIGS / "train.yaml"),
        {"hydra": {"runtime": {"output_dir": "/runs/x"}, "job": {"name": "train"}}},
    )
    assert raw.hydra.job.chdir is False
    assert raw.hydra.job_logging.handlers.file.filename == "/runs/x/train.log"
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", raw.hydra.run.dir)
    assert raw.hydra.output_subdir == ".hydra"
    monkeypatch.setenv("RANK", "1")  # as torchrun sets it: no directory, no files
    assert raw.hydra.run.dir == "." and raw.hydra.output_subdir is None
    assert raw.hydra.job_logging.handlers.file.filename == "/dev/null"


def test_wandb_mode_override():
    cfg = validate_config(compose(["logger.mode=online"]))
    assert cfg.logger.mode == "online"  # wins over $WANDB_MODE (test_train_e2e checks that one)


def test_top_level_seq_len_reaches_model_and_data():
    cfg = validate_config(compose(["seq_len=512"]))
    assert cfg.seq_len == 512 and cfg.model.max_seq_len == 512


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes(name):
    cfg = validate_config(compose([f"experiment={name}"]))
    assert cfg.model.max_seq_len == cfg.seq_len
    # the paper-scale presets are 8-GPU runs; the lab's tiny/gpu scales run on one device
    multi_gpu = name.startswith(("owt/", "pathx/", "path256/", "llama/", "bert/large"))
    plan = batch_plan(cfg, 8 if multi_gpu else 1, cfg.trainer.context_parallel)
    assert plan.global_batch_size * cfg.seq_len == plan.tokens_per_step
    if name.startswith("owt/gpt2s-"):
        k = int(name.split("-")[-1].rstrip("k"))
        assert cfg.seq_len == 1024 * k and (cfg.model.n_layer, cfg.model.d_model) == (12, 768)
        assert cfg.model.padded_vocab_size == 50304 and cfg.model.vocab_size == 50257
        assert cfg.data.name == "openwebtext" and plan.tokens_per_step == 524288
    if name.startswith(("pathx/", "path256/")):
        assert cfg.model.arch == "classifier" and cfg.data.num_classes == 2
        assert cfg.attention.impl == name.split("/")[1]
        assert cfg.seq_len == (16384 if name.startswith("pathx") else 65536)
    if name == "bert/large-512":
        assert (cfg.model.n_layer, cfg.model.d_model) == (24, 1024)  # bert-large
        assert cfg.seq_len == 512 and cfg.data.name == "bert_mlm"


GROUP_OPTIONS = [
    (group, option)
    for group in ("model", "attention", "data", "trainer", "optim", "logger")
    for option in group_options(group)
]


# What an option needs from the rest of the config (the default is GPT-2 on LM data: a model of
# another task needs its data, data of another task its model; images their seq_len).
def _classifier(side: int) -> list[str]:
    return ["model=pathx-classifier", f"seq_len={side * side}"]


NEEDS = {
    ("model", "pathx-classifier"): ["data=pathfinder32", "seq_len=1024"],
    ("model", "bert-base"): ["data=bert_mlm"],
    ("model", "bert-large"): ["data=bert_mlm"],
    ("data", "bert_mlm"): ["model=bert-base"],
    ("data", "pysrc_mlm"): ["model=bert-base"],
    ("data", "pathfinder32"): _classifier(32),
    ("data", "pathfinder64"): _classifier(64),
    ("data", "pathx"): _classifier(128),
    ("data", "path256"): _classifier(256),
    ("data", "long_doc"): ["model=bert-base", "model.head=classification"],
}


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes_onto_its_schema(group, option):
    cfg = validate_config(compose([f"{group}={option}", *NEEDS.get((group, option), [])]))
    assert type(getattr(cfg, group)).__name__.endswith("Config")


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["trainer.strategy=zero3"], "trainer.strategy='zero3'; allowed: auto, single, ddp, fsdp"),
        (["+trainer.max_step=10"], r"unknown key 'trainer.max_step'.*\(TrainerConfig\): max_steps"),
        (["+foo=1"], r"unknown key 'foo'; allowed keys of the config \(TrainConfig\)"),
        (["+data.val_sequences=16"], r"unknown key 'data.val_sequences'.*num_keys"),
        (["+attention.pattern=local"], r"unknown key 'attention.pattern'.*: impl$"),
        (["model.recompute=some"], "model.recompute='some'; allowed: none, all, every_k"),
    ],
)
def test_bad_values_and_unknown_keys_fail_at_start(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(compose(overrides))


@pytest.mark.parametrize(
    "override,match",
    [
        ("trainer.max_step=10", "Key 'max_step' not in 'TrainerConfig'"),
        ("data.num_keyz=3", "Key 'num_keyz' not in 'SyntheticConfig'"),
        ("trainer.max_steps=ten", "could not be converted to Integer"),
        ("optim.lr=fast", "could not be converted to Float"),
    ],
)
def test_typos_and_wrong_types_fail_while_hydra_composes(override, match):
    with pytest.raises(ConfigCompositionException) as error:
        compose([override])
    assert re.search(match, str(error.value.__cause__))


@pytest.mark.parametrize(
    "override,first_line",
    [
        ("trainer.max_step=10", "unknown key 'trainer.max_step' (did you mean trainer.max_steps?)"),
        ("max_steps=10", "unknown key 'max_steps' (did you mean trainer.max_steps?)"),
        ("n_layers=4", "unknown key 'n_layers' (did you mean model.n_layer?)"),
        (
            "optim.weight_decy=0.1",
            "unknown key 'optim.weight_decy' (did you mean optim.weight_decay",
        ),
        ("trainer.zzzz=1", "unknown key 'trainer.zzzz'; allowed keys of trainer (TrainerConfig)"),
        ("model=gpt2-smal", "unknown option model=gpt2-smal (did you mean"),
    ],
)
def test_a_typo_is_answered_by_the_closest_key_first(override, first_line):
    """train.py's message for a config Hydra cannot compose: ours first, with the closest key."""
    with pytest.raises((ConfigCompositionException, MissingConfigException)) as error:
        compose([override])
    message = composition_error_message(error.value)
    assert message.startswith(first_line), message
    assert "To append to your config" not in message


@pytest.mark.slow  # ~7 s (train.py in a subprocess); the messages are checked in-process above
def test_a_typo_on_the_command_line_names_the_allowed_keys(tmp_path):
    """train.py adds the schema's keys to Hydra's own message; a user error exits with 2."""
    res = run_train(["data.num_keyz=3"], cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    first = res.stderr.strip().splitlines()[0]
    assert first.startswith("unknown key 'data.num_keyz' (did you mean data.num_keys?)"), first
    assert "allowed keys of data (SyntheticConfig): loader, name, num_keys" in res.stderr
    assert "+data.num_keyz" not in res.stderr  # Hydra's advice to append a key the schema refuses
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("override", ["model=gpt5", "experiment=owt/gpt2s-1m", "data=imagenet"])
def test_unknown_group_option_names_the_choices(override):
    with pytest.raises(MissingConfigException) as err:
        compose([override])
    group, name = override.split("=")
    assert f"Could not find '{group}/{name}'" in str(err.value)
    if "/" not in name:  # Hydra lists the group's options (not those of a subfolder)
        assert f"Available options in '{group}'" in str(err.value)
    if group == "model":
        assert "gpt2-tiny" in str(err.value)


def test_values_that_cannot_work_together():
    with pytest.raises(ConfigError, match="longer than the model takes"):
        validate_config(compose(["seq_len=512", "model.max_seq_len=256"]))
    with pytest.raises(ConfigError, match="trainer.log_interval must be >= 1, got 0"):
        validate_config(compose(["trainer.log_interval=0"]))
    with pytest.raises(ConfigError, match="logger.mode='sometimes'; allowed: online, offline"):
        validate_config(compose(["logger.mode=sometimes"]))


def test_batch_plan():
    cfg = validate_config(compose(["global_batch_size=32", "micro_batch_size=4"]))
    plan = batch_plan(cfg, world_size=2)
    assert (plan.grad_accum, plan.global_batch_size) == (4, 32)
    assert plan.tokens_per_step == 32 * cfg.seq_len
    cfg = validate_config(
        compose(["global_batch_tokens=4096", "global_batch_size=null", "seq_len=128"])
    )
    assert batch_plan(cfg, world_size=1).global_batch_size == 32
    with pytest.raises(ConfigError, match="16 sequences does not split evenly over world_size=3"):
        batch_plan(
            validate_config(compose(["global_batch_size=16", "micro_batch_size=8"])), world_size=3
        )
    # micro_batch_size is an upper bound: the largest micro-batch that divides a rank's share
    cfg = validate_config(compose(["experiment=cpu/tiny"]))  # global 8, micro 8
    plan = batch_plan(cfg, world_size=2)  # torchrun --nproc_per_node=2 train.py experiment=cpu/tiny
    assert (plan.micro_batch_size, plan.grad_accum, plan.global_batch_size) == (4, 1, 8)
    assert (
        "micro 4 (micro_batch_size=8 is the most; 4 sequences per rank) x 2 ranks" in plan.split()
    )
    plan = batch_plan(validate_config(compose(["global_batch_size=36", "micro_batch_size=8"])), 2)
    assert (plan.micro_batch_size, plan.grad_accum) == (6, 3)  # 18 per rank: 6 divides, 7/8 not
    plan = batch_plan(validate_config(compose(["global_batch_size=32", "micro_batch_size=8"])), 2)
    assert (plan.micro_batch_size, plan.grad_accum, plan.micro_batch_reduced) == (8, 2, False)
    with pytest.raises(ConfigError, match="not a multiple of seq_len"):
        batch_plan(validate_config(compose(["global_batch_tokens=1000"])), world_size=1)
    cfg = validate_config(compose(["global_batch_size=null"]))
    assert batch_plan(cfg, world_size=2).grad_accum == 1  # null = one micro-batch per rank


def _tiny_preset_overrides(name: str, tmp: Path) -> list[str]:
    """Shrink a preset to CPU size, keeping its model family, attention, trainer and optimizer;
    data that needs downloads is replaced by a local stand-in of the same kind."""
    over = [
        f"experiment={name}",
        "trainer.max_steps=0",
        "logger=none",
        "micro_batch_size=2",
        "global_batch_tokens=null",
        "global_batch_size=4",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
    ]
    cfg = compose([f"experiment={name}"])
    if "cache_dir" in cfg.data:
        over.append(f"data.cache_dir={tmp / 'cache'}")
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a tiny corpus, words words.\n\n" for i in range(400)))
    if cfg.data.name == "openwebtext":
        over += ["data=text_files", f"data.data_files={corpus}", "data.sample_by=paragraph"]
        over += ["seq_len=64"]
    elif cfg.model.arch == "classifier":
        over += [
            "data.resolution=32",
            "seq_len=1024",
            "data.num_samples=20",
            "data.num_workers=1",
            "model.d_ff=64",
        ]
        if cfg.attention.impl == "blocksparse":
            over += ["attention.block_size=64"]
    elif cfg.data.name == "bert_mlm":
        vocab = tmp / "vocab.txt"
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "line", "of", "a", "tiny"]
        words += ["corpus", ",", ".", "words"] + [str(i) for i in range(10)]
        vocab.write_text("\n".join(words) + "\n")
        over += [
            f"data.data_files={corpus}",
            f"data.tokenizer_path={vocab}",
            "data.sample_by=paragraph",
            f"data.vocab_size={len(words)}",
            "model.d_ff=64",
            "seq_len=64",
        ]
    else:
        over += ["seq_len=64"]
    if cfg.model.arch == "llama":  # K/V heads dividing the 2 query heads; one process
        over += ["model.n_kv_head=1", "model.d_ff=64", "trainer.context_parallel=1"]
    return over


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_at_tiny_size(name, tmp_path, caplog):
    cfg = compose(_tiny_preset_overrides(name, tmp_path))
    caplog.set_level("INFO", logger="flashtrain")
    summary = run(cfg, run_dir=tmp_path / "run")
    assert summary["step"] == 0 and summary["params"] > 0
    assert f"params: {summary['params']}" in caplog.text
    assert not (tmp_path / "run" / "checkpoints").exists()  # max_steps=0 writes nothing
