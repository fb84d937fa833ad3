"""Finiteness is a rule of the typed config: a float field (float, float | None, list[float], in
nested dataclasses too) that is NaN or +-inf is refused by typed_config.to_dataclass, naming the
dotted key and the value, before the dataclass's own checks run, unless its declaration allows
it (dataclasses field metadata, typed_config.nonfinite_allowed). Every section goes through it:
the model (rope_theta, rms_norm_eps, the rope scaling fields), the trainer (grad_clip), the
optimizer (weight_decay, betas) and the data. (train.py's exit 2 before any data
is prepared: tests/train/test_train_finite_config.py.)"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pytest
from config_testing import compose
from omegaconf import OmegaConf

from flashtrain.models import model_config
from flashtrain.train import validate_config
from flashtrain.typed_config import ConfigError, nonfinite_allowed, to_dataclass

NAN, INF = math.nan, math.inf
TINY_LLAMA = dict(arch="llama", n_layer=1, n_head=2, n_kv_head=1, d_model=16, d_ff=32,
                  vocab_size=11, max_seq_len=16)  # fmt: skip
YARN = dict(type="yarn", factor=4.0, original_max_seq_len=8)
LLAMA3 = dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_seq_len=8)  # fmt: skip


def _refused(key: str, value: float) -> str:
    """The message's pattern: the dotted key, 'must be a finite number', the value."""
    return rf"^{re.escape(key)} must be a finite number, got {re.escape(str(value))}$"


# (a model config, the dotted key of a float field under model.)
MODEL_FIELDS = [
    (TINY_LLAMA, "rope_theta"),
    (TINY_LLAMA, "rms_norm_eps"),
    (TINY_LLAMA, "ffn_dim_multiplier"),
    (TINY_LLAMA, "init_std"),
    (TINY_LLAMA, "attn_logit_softcap"),
    ({**TINY_LLAMA, "rope_scaling": dict(type="linear", factor=2.0)}, "rope_scaling.factor"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.factor"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.beta_fast"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.beta_slow"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.mscale"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.mscale_all_dim"),
    ({**TINY_LLAMA, "rope_scaling": YARN}, "rope_scaling.attention_factor"),
    ({**TINY_LLAMA, "rope_scaling": LLAMA3}, "rope_scaling.low_freq_factor"),
    ({**TINY_LLAMA, "rope_scaling": LLAMA3}, "rope_scaling.high_freq_factor"),
    (dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, vocab_size=11), "rotary_base"),
    (dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, vocab_size=11), "layer_norm_eps"),
    (dict(arch="bert", n_layer=1, n_head=2, d_model=16, vocab_size=11), "dropout"),
]


def _with(cfg: dict, dotted: str, value) -> dict:
    """cfg with the (possibly nested) field `dotted` set to value."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cfg, key", MODEL_FIELDS, ids=[k for _, k in MODEL_FIELDS])
def test_a_nonfinite_model_value_is_refused_naming_the_key(cfg, key, value):
    with pytest.raises(ConfigError, match=_refused(f"model.{key}", value)):
        model_config(_with(cfg, key, value))


def test_the_run_config_refuses_them_in_every_section():
    """Through the trainer's own config path: Hydra composes, validate_config checks."""
    cases = {
        "trainer.grad_clip=nan": "trainer.grad_clip",
        "trainer.cpu_step_time_limit_s=inf": "trainer.cpu_step_time_limit_s",
        "optim.weight_decay=inf": "optim.weight_decay",
        "optim.lr=nan": "optim.lr",
        "optim.betas=[0.9,nan]": "optim.betas[1]",
        "model.layer_norm_eps=nan": "model.layer_norm_eps",
    }
    for override, key in cases.items():
        value = NAN if "nan" in override else INF
        with pytest.raises(ConfigError, match=_refused(key, value)):
            validate_config(compose([override]))
    text_files = ["data=text_files", "data.data_files=x.txt", "data.val_fraction=nan"]
    with pytest.raises(ConfigError, match=_refused("data.val_fraction", NAN)):
        validate_config(compose(text_files))
    llama = ["model=llama-tiny", "model.rope_scaling.type=linear", "model.rope_scaling.factor=inf"]
    with pytest.raises(ConfigError, match=_refused("model.rope_scaling.factor", INF)):
        validate_config(compose(llama))


# ---- the rule itself, on schemas of its own


@dataclass
class Inner:
    scale: float = 1.0
    limit: float = field(default=INF, metadata=nonfinite_allowed("inf: no limit"))


@dataclass
class Outer:
    rate: float = 0.5
    maybe: float | None = None
    pair: list[float] = field(default_factory=lambda: [1.0, 2.0])
    count: int = 3
    name: str = "x"
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self):  # runs after the finiteness check: it never sees a NaN
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")


@pytest.mark.parametrize(
    "values, key, value",
    [
        ({"rate": NAN}, "sec.rate", NAN),
        ({"maybe": -INF}, "sec.maybe", -INF),
        ({"pair": [1.0, INF]}, "sec.pair[1]", INF),
        ({"inner": {"scale": NAN}}, "sec.inner.scale", NAN),
    ],
)
def test_every_float_field_is_checked_mappings_and_instances_alike(values, key, value):
    with pytest.raises(ConfigError, match=_refused(key, value)):
        to_dataclass(Outer, values, what="sec")
    with pytest.raises(ConfigError, match=_refused(key, value)):  # as Hydra passes it
        to_dataclass(Outer, OmegaConf.create(values), what="sec")
    instance = Outer(**{k: Inner(**v) if k == "inner" else v for k, v in values.items()})
    with pytest.raises(ConfigError, match=_refused(key, value)):
        to_dataclass(Outer, instance, what="sec")


def test_a_string_is_checked_as_the_float_it_becomes():
    with pytest.raises(ConfigError, match=_refused("sec.rate", NAN)):
        to_dataclass(Outer, {"rate": "nan"}, what="sec")


def test_a_field_that_allows_nonfinite_values_takes_them():
    got = to_dataclass(Outer, {"inner": {"limit": INF}, "maybe": 2.5}, what="sec")
    assert got.inner.limit == INF and got.maybe == 2.5
    assert math.isnan(to_dataclass(Inner, {"limit": NAN}, what="sec").limit)
    assert to_dataclass(Outer, {}, what="") == Outer()  # defaults, ints and strings pass
