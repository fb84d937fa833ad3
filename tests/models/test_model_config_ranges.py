"""The ranges of the model config's float fields: each value outside its range is refused at
start-up with the key, the value and the allowed range (instead of a crash at the first forward,
e.g. a negative yarn beta_fast in math.log, or a silent default, e.g. beta_fast=0 read as 32).
The rope scaling ranges follow transformers' rope_config_validation (factor >= 1, beta_fast >=
beta_slow, attention_factor > 0, llama3's low_freq_factor < high_freq_factor). NaN and inf:
tests/test_typed_config_finite.py."""

from __future__ import annotations

import re

import pytest

from flashtrain.models import model_config
from flashtrain.typed_config import ConfigError

TINY_LLAMA = dict(arch="llama", n_layer=1, n_head=2, n_kv_head=1, d_model=16, d_ff=32,
                  vocab_size=11, max_seq_len=16)  # fmt: skip
TINY_GPT2 = dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, vocab_size=11)
YARN = dict(type="yarn", factor=4.0, original_max_seq_len=8)


def _yarn(**fields) -> dict:
    return {**TINY_LLAMA, "rope_scaling": {**YARN, **fields}}


@pytest.mark.parametrize(
    "cfg, message",
    [
        (_yarn(beta_fast=0.0), "model.rope_scaling.beta_fast must be > 0 (null: 32), got 0.0"),
        (_yarn(beta_slow=-1.0), "model.rope_scaling.beta_slow must be > 0 (null: 1), got -1.0"),
        (
            _yarn(beta_fast=2.0, beta_slow=4.0),
            "model.rope_scaling.beta_fast=2.0 must be >= model.rope_scaling.beta_slow=4.0",
        ),
        (_yarn(beta_slow=40.0), "beta_fast=32 (the default) must be >= model.rope_scaling.beta_s"),
        (_yarn(attention_factor=0.0), "model.rope_scaling.attention_factor must be > 0, got 0.0"),
        (_yarn(mscale=-1.0), "model.rope_scaling.mscale must be >= 0, got -1.0"),
        (_yarn(mscale_all_dim=-0.5), "model.rope_scaling.mscale_all_dim must be >= 0, got -0.5"),
        (_yarn(factor=0.5), "model.rope_scaling.factor must be >= 1, got 0.5"),
        ({**TINY_GPT2, "position": "rotary", "rotary_base": 1.0}, "model.rotary_base must be > 1"),
        ({**TINY_GPT2, "rotary_base": -5.0}, "model.rotary_base must be > 1, got -5.0"),
        ({**TINY_GPT2, "layer_norm_eps": 0.0}, "model.layer_norm_eps must be > 0, got 0.0"),
        (
            {**TINY_LLAMA, "ffn_dim_multiplier": 0.0, "d_ff": None},
            "model.ffn_dim_multiplier must be > 0 or null, got 0.0",
        ),  # fmt: skip
        ({**TINY_LLAMA, "init_std": -0.02}, "model.init_std must be > 0, got -0.02"),
        ({**TINY_LLAMA, "rope_theta": 0.0}, "model.rope_theta must be > 1, got 0.0"),
        ({**TINY_LLAMA, "rms_norm_eps": -1e-6}, "model.rms_norm_eps must be > 0, got -1e-06"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_range(cfg, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        model_config(cfg)


def test_values_inside_the_ranges_are_taken():
    cfg = model_config(_yarn(beta_fast=4.0, beta_slow=4.0, mscale=0.0, attention_factor=0.5))
    assert cfg.rope_scaling.beta_fast == cfg.rope_scaling.beta_slow == 4.0
    assert model_config({**TINY_GPT2, "rotary_base": 1.5}).rotary_base == 1.5
