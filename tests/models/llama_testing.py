"""transformers' LlamaForCausalLM / MistralForCausalLM as the independent reference for
flashtrain's Llama: the same config and weights on both sides (random, never downloaded)."""

from __future__ import annotations

import math

import pytest
import torch

from flashtrain.models import build_model

transformers = pytest.importorskip("transformers")

# Tiny shapes for the Triton interpreter: head_dim 16, GQA 4 query heads over 2 K/V heads.
TINY_LLAMA = dict(
    arch="llama",
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    d_model=64,
    d_ff=96,
    max_seq_len=64,
    vocab_size=97,
    rope_theta=10000.0,
)

_HF_ROPE_NAMES = {"original_max_seq_len": "original_max_position_embeddings"}


def hf_rope_parameters(cfg) -> dict:
    """Our rope_scaling as transformers' rope_parameters."""
    s = cfg.rope_scaling
    params = {"rope_type": "default" if s.type == "none" else s.type, "rope_theta": cfg.rope_theta}
    for name, value in vars(s).items():
        if name != "type" and value is not None:
            params[_HF_ROPE_NAMES.get(name, name)] = value
    return params


def hf_config(cfg, max_position_embeddings: int | None = None):
    """transformers' LlamaConfig (MistralConfig with a sliding window) of our LlamaConfig."""
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=max_position_embeddings or cfg.max_seq_len,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=hf_rope_parameters(cfg),
        attention_dropout=0.0,
    )
    if cfg.sliding_window:
        hf = transformers.MistralConfig(sliding_window=cfg.sliding_window, **common)
    else:
        hf = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    hf._attn_implementation = "sdpa"  # exact in float64 (eager softmaxes in float32)
    return hf


def hf_twin(model, dtype=torch.float64):
    """The transformers model with `model`'s weights, in `dtype`."""
    cfg = model.config
    # dynamic NTK: transformers takes max_position_embeddings as the original context
    dynamic = cfg.rope_scaling.type == "dynamic"
    hf_cfg = hf_config(cfg, cfg.rope_scaling.original_max_seq_len if dynamic else None)
    cls = transformers.MistralForCausalLM if cfg.sliding_window else transformers.LlamaForCausalLM
    hf = cls(hf_cfg).to(dtype).eval()
    state = {}
    for name, value in model.state_dict().items():
        if name.startswith("blocks."):
            name = "model.layers." + name[len("blocks.") :]
        elif name.startswith(("embed_tokens.", "norm.")):
            name = "model." + name
        state[name] = value.to(dtype)
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


def hf_state_names(hf_name: str) -> str:
    """transformers' parameter name -> ours."""
    name = hf_name.removeprefix("model.")
    return "blocks." + name[len("layers.") :] if name.startswith("layers.") else name


@pytest.fixture
def hf_norm_in_input_dtype(monkeypatch):
    """transformers' RMSNorm casts to float32 whatever the input (a guard for 16-bit inputs);
    in a float64 comparison that cast alone costs 1e-7. Here it computes in the input's dtype
    when that is float64, the formula otherwise transformers' own."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral

    def forward(self, hidden_states):
        dtype = torch.promote_types(hidden_states.dtype, torch.float32)
        h = hidden_states.to(dtype)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)
    monkeypatch.setattr(modeling_mistral.MistralRMSNorm, "forward", forward)


def randomise(model, scale=0.5):
    """Weights larger than the init's, so attention is far from uniform and errors would show;
    RMSNorm gains near 1."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, scale / math.sqrt(p.shape[-1]))
            else:
                p.normal_(1.0, 0.1)
    return model


def tiny_llama(attention="reference", dtype=torch.float64, **overrides):
    model = build_model({**TINY_LLAMA, **overrides}, attention)
    return randomise(model).to(dtype)
