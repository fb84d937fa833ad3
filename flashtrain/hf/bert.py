"""BERT <-> transformers' BertForMaskedLM (head=mlm) and BertForSequenceClassification
(head=classification).

Differences handled: the fused q/k/v projection split into query / key / value, the MLM decoder
tied to the word embeddings (with its own bias, cls.predictions.bias), vocabulary padding rows
dropped. Post-LayerNorm blocks map one to one: flashtrain's ln_1 (after attention) is
attention.output.LayerNorm, ln_2 (after the MLP) is output.LayerNorm. Import also takes hub
checkpoints saved as BertModel / BertForPreTraining (no "bert." prefix, LayerNorm gamma/beta,
the next-sentence head and the pooler an MLM model does not use); a classification model
started from a masked-LM checkpoint keeps its fresh classifier (and pooler, if absent).
"""

from __future__ import annotations

from flashtrain.hf.mapping import (
    ArchMapping,
    Rule,
    activation_from_hf,
    activation_to_hf,
    rules_for_layers,
)
from flashtrain.models.config import BertConfig

P = "bert."
CLASSES = {"mlm": "BertForMaskedLM", "classification": "BertForSequenceClassification"}


def _linear(ours: str, theirs: str) -> list[Rule]:
    return [Rule(f"{ours}.{p}", (f"{theirs}.{p}",)) for p in ("weight", "bias")]


def _layer(i: int) -> list[Rule]:
    ours, theirs = f"blocks.{i}.", f"{P}encoder.layer.{i}."
    att = f"{theirs}attention.self."
    return [
        *(
            Rule(
                f"{ours}attn.c_attn.{p}",
                tuple(f"{att}{n}.{p}" for n in ("query", "key", "value")),
                "split_rows",
            )
            for p in ("weight", "bias")
        ),
        *_linear(f"{ours}attn.c_proj", f"{theirs}attention.output.dense"),
        *_linear(f"{ours}ln_1", f"{theirs}attention.output.LayerNorm"),
        *_linear(f"{ours}mlp.c_fc", f"{theirs}intermediate.dense"),
        *_linear(f"{ours}mlp.c_proj", f"{theirs}output.dense"),
        *_linear(f"{ours}ln_2", f"{theirs}output.LayerNorm"),
    ]


class BertMapping(ArchMapping):
    arch = "bert"
    model_type = "bert"
    architecture_fields = (
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("d_model", "hidden_size"),
        ("d_ff", "intermediate_size"),
        ("vocab_size", "vocab_size"),
        ("type_vocab_size", "type_vocab_size"),
        ("activation", "hidden_act"),
        ("layer_norm_eps", "layer_norm_eps"),
    )

    def hf_class(self, cfg: BertConfig) -> str:
        return CLASSES[cfg.head]

    def hf_config(self, cfg: BertConfig) -> dict:
        out = {
            "model_type": "bert",
            "architectures": [self.hf_class(cfg)],
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.d_ff,
            "hidden_act": activation_to_hf(cfg.activation),
            "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": cfg.attn_dropout,
            "max_position_embeddings": cfg.max_seq_len,
            "type_vocab_size": cfg.type_vocab_size,
            "layer_norm_eps": cfg.layer_norm_eps,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
            "pad_token_id": None,
        }
        if cfg.head == "classification":
            out["num_labels"] = cfg.num_classes
            out["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
            out["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
            out["problem_type"] = "single_label_classification"
        return out

    def config_from_hf(self, hf: dict) -> dict:
        for field, want in (
            ("position_embedding_type", "absolute"),
            ("is_decoder", False),
            ("add_cross_attention", False),
        ):
            if field in hf and hf[field] != want:
                raise ValueError(
                    f"bert config {field}={hf[field]!r} is not implemented in flashtrain's BERT "
                    f"(it needs {field}={want!r})"
                )
        out = {
            "arch": "bert",
            "n_layer": int(hf["num_hidden_layers"]),
            "n_head": int(hf["num_attention_heads"]),
            "d_model": int(hf["hidden_size"]),
            "d_ff": int(hf["intermediate_size"]),
            "max_seq_len": int(hf["max_position_embeddings"]),
            "vocab_size": int(hf["vocab_size"]),
            "type_vocab_size": int(hf.get("type_vocab_size", 2)),
            "activation": activation_from_hf(hf.get("hidden_act", "gelu"), "hidden_act", "bert"),
            "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-12)),
            "dropout": float(hf.get("hidden_dropout_prob", 0.1)),
            "attn_dropout": float(hf.get("attention_probs_dropout_prob", 0.1)),
        }
        architectures = hf.get("architectures") or []
        if "BertForSequenceClassification" in architectures:
            labels = hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
            out.update(head="classification", num_classes=int(labels))
        else:
            out["head"] = "mlm"
        return out

    def rules(self, cfg: BertConfig) -> list[Rule]:
        emb = f"{P}embeddings."
        rules = [
            Rule("word_embeddings.weight", (f"{emb}word_embeddings.weight",), "vocab_rows"),
            Rule("position_embeddings.weight", (f"{emb}position_embeddings.weight",)),
            Rule("token_type_embeddings.weight", (f"{emb}token_type_embeddings.weight",)),
            *_linear("emb_ln", f"{emb}LayerNorm"),
            *rules_for_layers(cfg.n_layer, _layer),
        ]
        if cfg.head == "mlm":
            rules += [
                *_linear("mlm_dense", "cls.predictions.transform.dense"),
                *_linear("mlm_ln", "cls.predictions.transform.LayerNorm"),
                Rule("mlm_bias", ("cls.predictions.bias",), "vocab_rows"),
            ]
        else:
            rules += [*_linear("pooler", f"{P}pooler.dense"), *_linear("classifier", "classifier")]
        return rules

    def tied(self, cfg: BertConfig) -> dict[str, str]:
        if cfg.head != "mlm":
            return {}
        return {
            "cls.predictions.decoder.weight": f"{P}embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }

    def normalize_keys(self, state: dict, cfg: BertConfig) -> dict:
        out = {}
        for key, value in state.items():
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight")
            key = key.replace("LayerNorm.beta", "LayerNorm.bias")
            if key.startswith(("embeddings.", "encoder.", "pooler.")):
                key = P + key  # saved as BertModel
            out[key] = value
        return out

    def optional(self, cfg: BertConfig) -> tuple[str, ...]:
        return ("pooler.", "classifier.") if cfg.head == "classification" else ()

    def ignored(self, cfg: BertConfig) -> tuple[str, ...]:
        drop = ("cls.seq_relationship.", f"{P}embeddings.position_ids")
        if cfg.head == "mlm":
            return (*drop, f"{P}pooler.")
        return (*drop, "cls.predictions.")
