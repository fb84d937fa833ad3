"""What a causal language model can take: its positions and its parts. generate, evaluate,
the likelihood scores and the retrieval tasks ask these before anything is allocated."""

from __future__ import annotations


def position_limit(model) -> int | None:
    """Positions a model can take: its learned table's length, or None (rotary: no table)."""
    return model.config.max_seq_len if getattr(model, "position_tables", None) else None


def require_decoder(model, what: str = "the model") -> None:
    """Generation and evaluation need a causal language model with an LM head (see the module
    docstring): name what `what` holds instead (a BERT encoder, a sequence classifier)."""
    parts = ("hidden_states", "head_logits", "output_weight")
    if getattr(model, "causal", False) and all(callable(getattr(model, p, None)) for p in parts):
        return
    cfg = model.config
    head = f", model.head={cfg.head}" if getattr(cfg, "head", None) else ""
    raise ValueError(
        f"{what} holds a {type(model).__name__} (model.arch={cfg.arch}{head}), not a decoder: "
        "generate and evaluate take a causal language model (model.arch=gpt2 or llama)"
    )
