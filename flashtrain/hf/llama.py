"""Llama family <-> transformers' LlamaForCausalLM (MistralForCausalLM with a sliding window).

flashtrain's Llama names its modules as transformers does, so the weights map one to one
(model.layers.N <-> blocks.N; embeddings padded to pad_vocab_multiple <-> exactly vocab_size
rows; a tied head stored once). RoPE: model.rope_theta and model.rope_scaling <-> config.json's
rope_parameters (transformers 5; older rope_theta + rope_scaling read too), types none (default),
linear, dynamic, yarn, llama3; `original_max_seq_len` is transformers'
`original_max_position_embeddings` (absent: max_position_embeddings, as transformers defaults it),
and for "dynamic" transformers takes max_position_embeddings as the original context. Refused, naming them: softcaps (Gemma 2's architecture differs beyond
them), biases (Qwen 2), activations other than SiLU.
"""

from __future__ import annotations

from flashtrain.hf.mapping import ArchMapping, Rule, rules_for_layers
from flashtrain.models.config import TransformerConfig
from flashtrain.models.rotary import ROPE_SCALING_TYPES

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
_ROPE_FIELDS = ("factor", "original_max_seq_len", "low_freq_factor", "high_freq_factor",
                "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                "truncate")  # fmt: skip
_HF_ROPE_NAME = {"original_max_seq_len": "original_max_position_embeddings"}


def _layer(i: int) -> list[Rule]:
    ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
    names = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        *(f"self_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    ]
    return [Rule(ours + n, (theirs + n,)) for n in names]


def rope_parameters(cfg) -> dict:
    s = cfg.rope_scaling
    out = {"rope_type": "default" if s.type == "none" else s.type, "rope_theta": cfg.rope_theta}
    for name in _ROPE_FIELDS:
        value = getattr(s, name)
        if value is not None:
            out[_HF_ROPE_NAME.get(name, name)] = value
    if s.type == "dynamic":
        out.pop("original_max_position_embeddings")  # transformers: max_position_embeddings
    return out


def rope_from_hf(hf: dict) -> tuple[float, dict]:
    """(rope_theta, flashtrain rope_scaling dict) from transformers' rope_parameters or the
    older rope_theta + rope_scaling. The original context as transformers' standardize_rope_params
    takes it: yarn and llama3 read a top-level original_max_position_embeddings first (Phi-3's
    place), else rope_parameters', else max_position_embeddings; dynamic always the latter."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", params.pop("type", "default"))
    types = ("default", *(t for t in ROPE_SCALING_TYPES if t != "none"))
    if kind not in types:  # before its fields, so e.g. longrope is named, not long_factor
        raise ValueError(
            f"rope_parameters.rope_type={kind!r} is not implemented in flashtrain's rotary "
            f"scaling; allowed: {', '.join(types)}"
        )
    scaling = {"type": "none" if kind == "default" else kind}
    for key, value in params.items():
        name = "original_max_seq_len" if key == "original_max_position_embeddings" else key
        if name not in _ROPE_FIELDS:
            raise ValueError(
                f"rope_parameters.{key} is not implemented in flashtrain's rotary scaling; "
                f"allowed: {', '.join(_HF_ROPE_NAME.get(f, f) for f in _ROPE_FIELDS)}"
            )
        if value is not None:
            scaling[name] = value
    if kind in ("yarn", "llama3"):
        top = hf.get("original_max_position_embeddings")
        if top is not None:
            scaling["original_max_seq_len"] = int(top)
        scaling.setdefault("original_max_seq_len", int(hf["max_position_embeddings"]))
    if kind == "dynamic":  # transformers ignores rope_parameters' value here
        scaling["original_max_seq_len"] = int(hf["max_position_embeddings"])
    return theta, scaling


class LlamaMapping(ArchMapping):
    arch = "llama"
    model_type = "llama"
    model_types = tuple(MODEL_TYPES)
    architecture_fields = (
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("n_kv_head", "num_key_value_heads"),
        ("d_model", "hidden_size"),
        ("d_ff", "intermediate_size"),
        ("vocab_size", "vocab_size"),
        ("rms_norm_eps", "rms_norm_eps"),
        ("rope_theta", "rope_parameters"),
        ("tie_embeddings", "tie_word_embeddings"),
        ("sliding_window", "sliding_window"),
    )

    def hf_class(self, cfg: TransformerConfig) -> str:
        return MODEL_TYPES["mistral" if cfg.sliding_window else "llama"]

    def hf_config(self, cfg) -> dict:
        for key in ("attn_logit_softcap", "final_logit_softcap"):
            if getattr(cfg, key):
                raise ValueError(
                    f"a Llama with model.{key} has no transformers equivalent (Gemma 2 softcaps, "
                    "but its blocks and embeddings differ); export models without softcaps"
                )
        dynamic = cfg.rope_scaling.type == "dynamic"
        out = {
            "model_type": "mistral" if cfg.sliding_window else "llama",
            "architectures": [self.hf_class(cfg)],
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "head_dim": cfg.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": (
                cfg.rope_scaling.original_max_seq_len if dynamic else cfg.max_seq_len
            ),
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_parameters": rope_parameters(cfg),
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
            "bos_token_id": None,
            "eos_token_id": None,
        }
        if cfg.sliding_window:
            out["sliding_window"] = cfg.sliding_window
        else:
            out.update(attention_bias=False, mlp_bias=False)
        return out

    def config_from_hf(self, hf: dict) -> dict:
        model_type = hf.get("model_type")
        for field, want in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
            if field in hf and hf[field] != want:
                raise ValueError(
                    f"{model_type} config {field}={hf[field]!r} is not implemented in flashtrain's "
                    f"Llama (it needs {field}={want!r})"
                )
        d_model, n_head = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        if hf.get("head_dim") not in (None, d_model // n_head):
            raise ValueError(
                f"{model_type} config head_dim={hf['head_dim']} is not hidden_size / "
                f"num_attention_heads = {d_model // n_head}, which flashtrain's Llama needs"
            )
        theta, scaling = rope_from_hf(hf)
        window = hf.get("sliding_window") if model_type == "mistral" else None
        return {
            "arch": "llama",
            "n_layer": int(hf["num_hidden_layers"]),
            "n_head": n_head,
            "n_kv_head": int(hf.get("num_key_value_heads") or n_head),
            "d_model": d_model,
            "d_ff": int(hf["intermediate_size"]),
            "max_seq_len": int(hf["max_position_embeddings"]),
            "vocab_size": int(hf["vocab_size"]),
            "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
            "sliding_window": int(window) if window else None,
            "attn_dropout": float(hf.get("attention_dropout", 0.0)),
            "dropout": 0.0,
            "init_std": float(hf.get("initializer_range", 0.02)),
        }

    def rules(self, cfg) -> list[Rule]:
        rules = [
            Rule("embed_tokens.weight", ("model.embed_tokens.weight",), "vocab_rows"),
            *rules_for_layers(cfg.n_layer, _layer),
            Rule("norm.weight", ("model.norm.weight",)),
        ]
        if not cfg.tie_embeddings:
            rules.append(Rule("lm_head.weight", ("lm_head.weight",), "vocab_rows"))
        return rules

    def tied(self, cfg) -> dict[str, str]:
        return {"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_embeddings else {}

    def normalize_keys(self, state: dict, cfg) -> dict:
        # rotary inverse frequencies: buffers of older checkpoints, recomputed from the config
        return {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
