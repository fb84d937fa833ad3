"""Llama family: transformers LlamaForCausalLM / MistralForCausalLM -> from_hf -> to_hf gives
the same state dict and the same logits (float64, ~1e-12), GQA and each rope_scaling type."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hf_testing import assert_same_state, randomise_, rel_err, transformers

from flashtrain.hf import from_hf, to_hf

REF = {"impl": "reference"}  # float64 end to end, windows included

ROPE = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}  # fmt: skip


@pytest.fixture(autouse=True)
def hf_norm_in_input_dtype(monkeypatch):
    """transformers' RMSNorm casts to float32 whatever the input (a guard for 16-bit inputs),
    which alone costs 1e-7 in a float64 comparison: here it computes in float64 for float64."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral

    def forward(self, hidden_states):
        h = hidden_states.to(torch.promote_types(hidden_states.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)
    monkeypatch.setattr(modeling_mistral.MistralRMSNorm, "forward", forward)


def tiny(kind="llama", rope="default", **overrides):
    fields = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=57, max_position_embeddings=16, rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 10000.0, **ROPE[rope]}, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    fields.update(overrides)
    if kind == "mistral":
        cfg, cls = transformers.MistralConfig(**fields), transformers.MistralForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**fields), transformers.LlamaForCausalLM
    cfg._attn_implementation = "sdpa"  # exact in float64 (eager softmaxes in float32)
    torch.manual_seed(0)
    return randomise_(cls(cfg).double(), seed=1).eval()


CASES = {
    "gqa": dict(),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    **{f"rope-{name}": dict(rope=name) for name in ROPE if name != "default"},
    "mistral-window": dict(kind="mistral", sliding_window=5),
}


@pytest.mark.parametrize("case", CASES)
def test_llama_round_trip(case):
    options = dict(CASES[case])
    hf = tiny(options.pop("kind", "llama"), options.pop("rope", "default"), **options)
    model = from_hf(hf, attention=REF, pad_vocab_multiple=8).eval()
    assert (
        model.embed_tokens.weight.shape[0] == 64
        and model.config.n_kv_head == hf.config.num_key_value_heads
    )
    back = to_hf(model)
    assert type(back) is type(hf)
    assert_same_state(back.state_dict(), hf.state_dict())
    if hf.config.tie_word_embeddings:
        assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    assert back.config.rope_parameters == hf.config.rope_parameters
    ids = torch.randint(
        0, 57, (2, 23), generator=torch.Generator().manual_seed(2)
    )  # > 16 positions
    with torch.no_grad():
        want = hf(ids).logits
        got = model.logits(ids)
    assert rel_err(got, want) < 1e-12


@pytest.mark.parametrize(
    "rope, top_level", [("yarn", None), ("llama3", None), ("yarn", 8), ("dynamic", None)]
)
def test_rope_original_context_as_transformers_takes_it(tmp_path, rope, top_level):
    """A config.json whose rope_parameters lack original_max_position_embeddings: transformers
    takes a top-level one (Phi-3's place) or max_position_embeddings; dynamic always the latter
    (its stray value here is ignored). rope_theta=100 makes the original context matter at
    head_dim 16."""
    hf = tiny(rope=rope, rope_parameters={"rope_theta": 100.0, **ROPE[rope]})
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if rope == "dynamic":
        config["rope_parameters"]["original_max_position_embeddings"] = 4
    else:
        del config["rope_parameters"]["original_max_position_embeddings"]
    if top_level is not None:
        config["original_max_position_embeddings"] = top_level
    (tmp_path / "config.json").write_text(json.dumps(config))
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, attn_implementation="sdpa"
    ).eval()
    model = from_hf(str(tmp_path), attention=REF).eval()
    assert model.config.rope_scaling.original_max_seq_len == (top_level or 16)
    ids = torch.randint(0, 57, (2, 40), generator=torch.Generator().manual_seed(2))  # > 16
    with torch.no_grad():
        want = ref(ids).logits
        assert rel_err(model.logits(ids), want) < 1e-12
        # the original context matters here: another one moves the logits
        original = 2 * model.config.rope_scaling.original_max_seq_len
        other = dataclasses.replace(model.config.rope_scaling, original_max_seq_len=original)
        moved = from_hf(str(tmp_path), attention=REF, rope_scaling=dataclasses.asdict(other))
        assert rel_err(moved.eval().logits(ids), want) > 1e-6


def test_unknown_rope_type_is_refused_by_name():
    hf = tiny()
    config = hf.config.to_dict()
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0,
                                 "long_factor": [1.0] * 8, "short_factor": [1.0] * 8,
                                 "original_max_position_embeddings": 16}  # fmt: skip
    from flashtrain.hf.llama import LlamaMapping

    with pytest.raises(ValueError, match=r"rope_type='longrope' is not implemented .*allowed: "
                                         r"default, linear, dynamic, yarn, llama3"):  # fmt: skip
        LlamaMapping().config_from_hf(config)


def test_llama_refusals():
    with pytest.raises(ValueError, match="attention_bias=True is not implemented"):
        from_hf(tiny(attention_bias=True), attention=REF)
    with pytest.raises(ValueError, match="hidden_act='gelu' is not implemented"):
        from_hf(tiny(hidden_act="gelu"), attention=REF)
    from flashtrain.models import build_model

    capped = build_model(dict(arch="llama", n_layer=1, n_head=2, n_kv_head=1, d_model=32, d_ff=64,
                              vocab_size=40, max_seq_len=16, attn_logit_softcap=30.0), REF)  # fmt: skip
    with pytest.raises(ValueError, match="attn_logit_softcap has no transformers equivalent"):
        to_hf(capped)


def test_init_from_a_llama_folder_at_a_longer_context(tmp_path):
    """model.init_from=hf: with the run's own rope_scaling (a longer context than the
    checkpoint's): the weights as they are; an architecture mismatch refused naming the field."""
    from flashtrain.checkpoint import initial_weights
    from flashtrain.models import build_model

    hf = tiny().float()
    hf.save_pretrained(tmp_path / "llama")
    cfg = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, vocab_size=57,
               rms_norm_eps=1e-6, rope_theta=10000.0, max_seq_len=64,
               rope_scaling=dict(type="linear", factor=4.0), init_from=f"hf:{tmp_path / 'llama'}")  # fmt: skip
    model = build_model(cfg, REF)
    initial_weights(model, model.config.init_from)
    assert torch.equal(
        model.blocks[1].self_attn.k_proj.weight, hf.model.layers[1].self_attn.k_proj.weight
    )
    assert torch.equal(model.lm_head.weight, hf.lm_head.weight)
    mismatched = build_model({**cfg, "n_kv_head": 4}, REF)
    with pytest.raises(ValueError, match=r"model.n_kv_head=4 but .* num_key_value_heads=2"):
        initial_weights(mismatched, mismatched.config.init_from)


def test_export_of_a_llama_checkpoint(tmp_path):
    from hf_testing import save_model_checkpoint

    from flashtrain.checkpoint.export_hf import export_checkpoint
    from flashtrain.models import build_model

    torch.manual_seed(3)
    cfg = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=96, vocab_size=57,
               max_seq_len=32, rope_theta=10000.0, pad_vocab_multiple=16,
               rope_scaling=dict(type="yarn", factor=2.0, original_max_seq_len=16))  # fmt: skip
    model = randomise_(build_model(cfg, REF), seed=4).eval()
    ckpt = save_model_checkpoint(tmp_path / "ckpt", model, {"data": {"name": "synthetic"}})
    out = export_checkpoint(ckpt, tmp_path / "out")
    assert (out / "generation_config.json").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.lm_head.weight.shape == (57, 64)
    ids = torch.randint(0, 57, (1, 32), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert rel_err(model.logits(ids), hf(ids).logits) < 1e-5
