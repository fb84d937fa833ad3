"""Each rope_scaling type's cos / sin tables against transformers' own rotary implementation
(LlamaRotaryEmbedding with rope_parameters), at positions inside and beyond the original
context; and the config's refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from llama_testing import TINY_LLAMA, hf_config

from flashtrain.models import build_model, model_config
from flashtrain.models.rotary import RopeScalingConfig
from flashtrain.typed_config import ConfigError

transformers = pytest.importorskip("transformers")

SCALINGS = {
    "none": dict(type="none"),
    "linear": dict(type="linear", factor=4.0),
    "dynamic": dict(type="dynamic", factor=4.0, original_max_seq_len=512),
    "yarn": dict(type="yarn", factor=8.0, original_max_seq_len=512),
    "yarn-mscale": dict(
        type="yarn",
        factor=40.0,
        original_max_seq_len=512,
        beta_fast=16.0,
        beta_slow=2.0,
        mscale=1.0,
        mscale_all_dim=0.5,
        truncate=False,
    ),
    "yarn-attention-factor": dict(
        type="yarn", factor=4.0, original_max_seq_len=512, attention_factor=1.25
    ),
    "llama3": dict(
        type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_seq_len=512,
    ),
}


@pytest.mark.parametrize("seqlen", [300, 3000])  # inside / beyond the original 512
@pytest.mark.parametrize("name", list(SCALINGS))
def test_tables_equal_transformers(name, seqlen):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = build_model(
        {**TINY_LLAMA, "d_model": 256, "n_head": 2, "rope_scaling": SCALINGS[name]}, "sdpa"
    )
    cfg = model.config
    dynamic = cfg.rope_scaling.type == "dynamic"
    hf_cfg = hf_config(cfg, cfg.rope_scaling.original_max_seq_len if dynamic else None)
    rotary = LlamaRotaryEmbedding(hf_cfg)
    positions = torch.arange(seqlen)[None]  # (1, T)
    x = torch.zeros(1, seqlen, 128, dtype=torch.float32)
    cos_hf, sin_hf = rotary(x, positions)  # (1, T, D), the two halves equal
    cos, sin = model.rotary_tables(positions, seqlen)  # (1, T, D/2)
    half = cfg.head_dim // 2
    assert torch.equal(cos_hf[..., :half], cos_hf[..., half:])
    torch.testing.assert_close(cos, cos_hf[..., :half], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin, sin_hf[..., :half], rtol=0, atol=2e-6)
    if name != "none":  # scaling changes the tables (so the comparison says something)
        plain = build_model({**TINY_LLAMA, "d_model": 256, "n_head": 2}, "sdpa")
        moved = (plain.rotary_tables(positions, seqlen)[0] - cos).abs().max()
        assert moved > 1e-3 or (dynamic and seqlen <= 512)


def test_gpt2_rotary_rotates_by_the_unscaled_llama_tables(monkeypatch):
    """GPT-2's position=rotary and Llama share one RoPE implementation: GPT-2 rotates q and k
    by exactly the tables of a Llama without scaling at the same base (transformers' default
    rope, test_tables_equal_transformers), bit for bit."""
    from flashtrain.models import transformer

    seen = []
    apply = transformer.apply_rotary
    monkeypatch.setattr(
        transformer, "apply_rotary", lambda x, cos, sin: seen.append(cos) or apply(x, cos, sin)
    )
    gpt2 = build_model(
        dict(arch="gpt2", n_layer=1, n_head=4, d_model=64, vocab_size=97, max_seq_len=64,
             position="rotary", rotary_base=500.0),
        "sdpa",
    )  # fmt: skip
    llama = build_model({**TINY_LLAMA, "rope_theta": 500.0}, "sdpa")
    assert gpt2.config.head_dim == llama.config.head_dim == 16
    positions = torch.arange(3000)[None]  # far positions: where two formulas part
    with torch.no_grad():
        gpt2.hidden_states(torch.zeros(1, 3000, dtype=torch.long))
    cos, _ = llama.rotary_tables(positions)  # (1, T, D/2)
    assert len(seen) == 2 and torch.equal(seen[0][..., 0, :], cos)  # q and k


def test_dynamic_grows_the_base_only_past_the_original_context():
    model = build_model({**TINY_LLAMA, "rope_scaling": SCALINGS["dynamic"]}, "sdpa")
    plain = build_model(TINY_LLAMA, "sdpa")
    pos = torch.arange(100)
    assert torch.equal(model.rotary_tables(pos, 512)[0], plain.rotary_tables(pos)[0])
    assert not torch.equal(model.rotary_tables(pos, 513)[0], plain.rotary_tables(pos)[0])


@pytest.mark.parametrize(
    "scaling, message",
    [
        (dict(type="ntk"), "rope_scaling.type='ntk'; allowed: none, linear, dynamic, yarn, llama3"),
        (dict(type="linear"), "type=linear needs model.rope_scaling.factor"),
        (dict(type="yarn", factor=4.0), "needs model.rope_scaling.original_max_seq_len"),
        (
            dict(type="llama3", factor=8.0, original_max_seq_len=8192),
            "needs model.rope_scaling.low_freq_factor, model.rope_scaling.high_freq_factor",
        ),
        (dict(type="linear", factor=4.0, beta_fast=32.0), "beta_fast does not apply"),
        (dict(type="linear", factor=0.5), "factor must be >= 1"),
        (dict(type="none", factor=2.0), "factor does not apply to rope_scaling.type=none"),
    ],
)
def test_bad_rope_scaling_is_refused(scaling, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_model({**TINY_LLAMA, "rope_scaling": scaling}, "sdpa")


@pytest.mark.parametrize("name", ["yarn-mscale", "dynamic"])
def test_scaling_survives_the_checkpoint_round_trip(name):
    """A checkpoint's meta.json holds the model config as JSON (dataclasses.asdict); the model
    rebuilt from it (trainer resume, export, init_from a checkpoint folder) has the same
    scaling, as a RopeScalingConfig, and rotates by the same tables. A RopeScalingConfig
    instance inside a mapping is taken as it is."""
    cfg = model_config({**TINY_LLAMA, "rope_scaling": SCALINGS[name]})
    stored = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert stored["rope_scaling"] == {**dict.fromkeys(stored["rope_scaling"]), **SCALINGS[name]}
    back = model_config(stored)
    assert back == cfg and isinstance(back.rope_scaling, RopeScalingConfig)
    assert back.rope_scaling.depends_on_length == (name == "dynamic")
    again = model_config({**TINY_LLAMA, "rope_scaling": RopeScalingConfig(**SCALINGS[name])})
    assert again == cfg
    positions = torch.arange(2000)
    a = build_model(cfg, "sdpa").rotary_tables(positions, 2000)
    b = build_model(back, "sdpa").rotary_tables(positions, 2000)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
