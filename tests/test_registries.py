"""One registry convention for models, data loaders and attention impls: each buildable class
carries its config dataclass as `Config` (whose key field's default names it), the tables are
derived from the list of classes, and the Hydra schemas are registered by an explicit call."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from flashtrain.data.lm import TokenCacheLM
from flashtrain.data.lm_stream import StreamingLM
from flashtrain.data.registry import DATA, DATA_CONFIGS, LOADERS, data_config
from flashtrain.models import (
    ARCHS,
    GPT2,
    MODEL_CONFIGS,
    MODELS,
    GPT2Config,
    TransformerConfig,
    build_model,
)
from flashtrain.models.attention_layers import ATTENTION, ATTENTION_CONFIGS, ATTENTION_IMPLS
from flashtrain.typed_config import ConfigError, Registry

REGISTRIES = {"model": MODELS, "data": DATA, "attention": ATTENTION}


@pytest.mark.parametrize("group", REGISTRIES)
def test_each_class_carries_the_config_its_key_names(group):
    registry = REGISTRIES[group]
    assert registry.classes
    for name, cls in registry.classes.items():
        assert getattr(cls.Config, registry.key) == name
        assert registry.configs[name] is cls.Config


def test_the_public_tables_are_the_registries():
    assert (ARCHS, MODEL_CONFIGS) == (MODELS.classes, MODELS.configs)
    assert (LOADERS, DATA_CONFIGS) == (DATA.classes, DATA.configs)
    assert (ATTENTION_IMPLS, ATTENTION_CONFIGS) == (ATTENTION.classes, ATTENTION.configs)


@dataclass
class WideGPT2Config(GPT2Config):
    arch: str = "wide_gpt2"
    n_layer: int = 1
    n_head: int = 2
    d_model: int = 64
    vocab_size: int = 97
    max_seq_len: int = 16


class WideGPT2(GPT2):
    Config = WideGPT2Config


def test_a_new_model_is_one_more_class_in_the_list():
    models = Registry("arch", "model", [*MODELS.classes.values(), WideGPT2])
    cfg = models.config({"arch": "wide_gpt2", "d_model": 32})
    assert type(cfg) is WideGPT2Config and (cfg.d_model, cfg.n_layer) == (32, 1)
    model = models.build_class(cfg)(cfg, "reference")
    assert type(model) is WideGPT2 and model.config is cfg
    with pytest.raises(ConfigError, match="wide_gpt2"):  # the shipped registry does not know it
        build_model({"arch": "wide_gpt2"}, "reference")


def test_a_key_is_unique_and_not_empty():
    with pytest.raises(ValueError, match="its own non-empty arch"):
        Registry("arch", "model", [GPT2, WideGPT2, GPT2])

    class Nameless(GPT2):
        Config = TransformerConfig  # arch: ""

    with pytest.raises(ValueError, match="Nameless"):
        Registry("arch", "model", [Nameless])


def test_unknown_keys_list_what_is_registered():
    with pytest.raises(ConfigError, match="allowed: gpt2, bert, classifier"):
        MODELS.config({"arch": "gtp2"})


@pytest.mark.parametrize("streaming, loader", [(False, TokenCacheLM), (True, StreamingLM)])
def test_the_streaming_flag_picks_its_class_on_the_corpus_loader(streaming, loader):
    cfg = data_config({"loader": "lm_corpus", "data_files": "x.txt", "streaming": streaming})
    assert DATA.build_class(cfg) is TokenCacheLM
    assert DATA.build_class(cfg).for_config(cfg) is loader


def test_schemas_are_registered_by_an_explicit_call_not_by_import():
    code = (
        "from hydra.core.config_store import ConfigStore\n"
        "import flashtrain.train\n"
        "print('schema' in ConfigStore.instance().repo)\n"
        "flashtrain.train.register_schemas()\n"
        "print(sorted(ConfigStore.instance().repo['schema']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    before, after = run.stdout.splitlines()
    assert before == "False"
    assert after == str(["attention", "data", "logger", "model", "optim", "trainer"])
