"""Tiny random transformers models for the interop tests (built from configs, never downloaded)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")


def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights far from any init (attention far from uniform, LayerNorm gains away from 1), so a
    misplaced or transposed tensor shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            scale = 0.6 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.2
            p.copy_(noise * scale + (1.0 if p.dim() == 1 and "weight" in _name(model, p) else 0.0))
    return model


def _name(model, param) -> str:
    for name, p in model.named_parameters():
        if p is param:
            return name
    return ""


def tiny_gpt2(seed: int = 0, **overrides):
    cfg = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=40, vocab_size=61,
        bos_token_id=None, eos_token_id=None, **overrides,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomise_(transformers.GPT2LMHeadModel(cfg).double(), seed).eval()


def tiny_bert_config(**overrides):
    fields = dict(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=48,
        max_position_embeddings=40, vocab_size=53, type_vocab_size=2, pad_token_id=0,
    )  # fmt: skip
    fields.update(overrides)
    return transformers.BertConfig(**fields)


def tiny_bert_mlm(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(tiny_bert_config(**overrides)).double()
    model.config._attn_implementation = "eager"
    return randomise_(model, seed).eval()


def tiny_bert_classifier(seed: int = 0, num_labels: int = 3):
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(tiny_bert_config(num_labels=num_labels))
    model.config._attn_implementation = "eager"
    return randomise_(model.double(), seed).eval()


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()
