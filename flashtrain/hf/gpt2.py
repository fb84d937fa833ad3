"""GPT-2 <-> transformers' GPT2LMHeadModel.

Differences handled: Conv1D weights stored (in, out) (transposed here), the head tied to wte
(lm_head.weight), vocabulary padding rows dropped, the position table's length as n_positions.
Hub checkpoints saved as GPT2Model lack the "transformer." prefix and carry causal-mask
buffers (h.N.attn.bias / masked_bias): both normalised on import. position=rotary has no
GPT2LMHeadModel equivalent and is refused.
"""

from __future__ import annotations

from flashtrain.hf.mapping import (
    ArchMapping,
    Rule,
    activation_from_hf,
    activation_to_hf,
    rules_for_layers,
)
from flashtrain.models.config import GPT2Config

P = "transformer."


def _layer(i: int) -> list[Rule]:
    ours, theirs = f"blocks.{i}.", f"{P}h.{i}."
    rules = []
    for name in ("ln_1", "ln_2"):
        for p in ("weight", "bias"):
            rules.append(Rule(f"{ours}{name}.{p}", (f"{theirs}{name}.{p}",)))
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        rules.append(Rule(f"{ours}{name}.weight", (f"{theirs}{name}.weight",), "transpose"))
        rules.append(Rule(f"{ours}{name}.bias", (f"{theirs}{name}.bias",)))
    return rules


class GPT2Mapping(ArchMapping):
    arch = "gpt2"
    model_type = "gpt2"
    architecture_fields = (
        ("n_layer", "n_layer"),
        ("n_head", "n_head"),
        ("d_model", "n_embd"),
        ("d_ff", "n_inner"),
        ("vocab_size", "vocab_size"),
        ("activation", "activation_function"),
        ("layer_norm_eps", "layer_norm_epsilon"),
        ("position", "position"),
    )

    def hf_class(self, cfg: GPT2Config) -> str:
        return "GPT2LMHeadModel"

    def hf_config(self, cfg: GPT2Config) -> dict:
        if cfg.position != "learned":
            raise ValueError(
                f"GPT-2 with model.position={cfg.position} has no transformers equivalent "
                "(GPT2LMHeadModel has learned positions only); export position=learned models"
            )
        return {
            "model_type": "gpt2",
            "architectures": [self.hf_class(cfg)],
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.max_seq_len,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": cfg.d_ff,
            "activation_function": activation_to_hf(cfg.activation),
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attn_dropout,
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True,
            "bos_token_id": None,
            "eos_token_id": None,
        }

    def config_from_hf(self, hf: dict) -> dict:
        refused = {
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False,
            "tie_word_embeddings": True,
        }
        for field, want in refused.items():
            if field in hf and bool(hf[field]) != want:
                raise ValueError(
                    f"gpt2 config {field}={hf[field]!r} is not implemented in flashtrain's GPT-2 "
                    f"(it needs {field}={want})"
                )
        d_model = int(hf["n_embd"])
        return {
            "arch": "gpt2",
            "n_layer": int(hf["n_layer"]),
            "n_head": int(hf["n_head"]),
            "d_model": d_model,
            "d_ff": int(hf.get("n_inner") or 4 * d_model),
            "max_seq_len": int(hf["n_positions"]),
            "vocab_size": int(hf["vocab_size"]),
            "activation": activation_from_hf(
                hf.get("activation_function", "gelu_new"), "activation_function", "gpt2"
            ),
            "layer_norm_eps": float(hf.get("layer_norm_epsilon", 1e-5)),
            "dropout": float(hf.get("resid_pdrop", 0.1)),
            "attn_dropout": float(hf.get("attn_pdrop", 0.1)),
            "position": "learned",
        }

    def rules(self, cfg: GPT2Config) -> list[Rule]:
        return [
            Rule("wte.weight", (f"{P}wte.weight",), "vocab_rows"),
            Rule("wpe.weight", (f"{P}wpe.weight",)),
            *rules_for_layers(cfg.n_layer, _layer),
            Rule("ln_f.weight", (f"{P}ln_f.weight",)),
            Rule("ln_f.bias", (f"{P}ln_f.bias",)),
        ]

    def tied(self, cfg: GPT2Config) -> dict[str, str]:
        return {"lm_head.weight": f"{P}wte.weight"}

    def normalize_keys(self, state: dict, cfg: GPT2Config) -> dict:
        out = {}
        for key, value in state.items():
            if key.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # causal-mask buffers of old GPT2Model checkpoints, not weights
            if not key.startswith((P, "lm_head.")):
                key = P + key  # saved as GPT2Model (openai-community/gpt2)
            out[key] = value
        return out
