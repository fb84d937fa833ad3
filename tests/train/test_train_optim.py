"""AdamW parameter groups and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from flashtrain.train.config import OptimConfig
from flashtrain.train.optim import build_optimizer, build_scheduler, lr_factor, param_groups


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(10, 4)
        self.wpe = nn.Embedding(8, 4)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
            for _ in range(2)
        )
        self.ln_f = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight  # tied


def test_groups_decay_only_linear_matrices():
    model = TinyLM()
    decay, rest = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert sorted(decay["names"]) == sorted(
        f"blocks.{i}.{j}.weight" for i in range(2) for j in (1, 3)
    )
    assert "wte.weight" in rest["names"] and "wpe.weight" in rest["names"]
    assert "ln_f.weight" in rest["names"] and "blocks.0.1.bias" in rest["names"]
    # every parameter exactly once; the tied head is not counted twice
    n = sum(p.numel() for g in (decay, rest) for p in g["params"])
    assert n == sum(p.numel() for p in model.parameters())
    assert len({id(p) for g in (decay, rest) for p in g["params"]}) == len(list(model.parameters()))


def test_groups_options_move_parameters():
    model = TinyLM()
    decay, _ = param_groups(model, 0.1, decay_embeddings=True, decay_norm_and_bias=True)
    assert "wte.weight" in decay["names"] and "ln_f.weight" in decay["names"]
    assert "blocks.1.3.bias" in decay["names"]


def test_weight_decay_is_decoupled_and_grouped():
    model = TinyLM()
    cfg = OmegaConf.structured(OptimConfig(lr=0.1, weight_decay=0.5, warmup_steps=0))
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    before_lin = model.blocks[0][1].weight.detach().clone()
    before_ln = model.ln_f.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    # zero gradient: only decoupled decay moves the weights, by exactly lr * wd
    torch.testing.assert_close(model.blocks[0][1].weight, before_lin * (1 - 0.1 * 0.5))
    torch.testing.assert_close(model.ln_f.weight, before_ln)


def test_warmup_then_cosine_to_min_ratio():
    kw = dict(warmup_steps=10, decay_steps=110, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, **kw) == pytest.approx(0.1)
    assert lr_factor(9, **kw) == pytest.approx(1.0)
    assert lr_factor(10, **kw) == pytest.approx(1.0)
    assert lr_factor(60, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    assert lr_factor(110, **kw) == pytest.approx(0.1)
    assert lr_factor(500, **kw) == pytest.approx(0.1)
    values = [lr_factor(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_linear_and_constant_schedules():
    lin = dict(warmup_steps=0, decay_steps=100, schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(0, **lin) == 1.0
    assert lr_factor(25, **lin) == pytest.approx(0.75)
    assert lr_factor(100, **lin) == 0.0
    const = dict(warmup_steps=4, decay_steps=100, schedule="constant", min_lr_ratio=0.0)
    assert [lr_factor(s, **const) for s in (0, 3, 4, 99)] == [0.25, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_factor(50, warmup_steps=0, decay_steps=100, schedule="step")


def test_scheduler_follows_lr_factor_and_defaults_to_max_steps():
    model = TinyLM()
    cfg = OmegaConf.structured(OptimConfig(lr=2.0, warmup_steps=3, min_lr_ratio=0.0))
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg, max_steps=13)
    seen = []
    for _ in range(14):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [
        2.0 * lr_factor(s, warmup_steps=3, decay_steps=13, schedule="cosine", min_lr_ratio=0.0)
        for s in range(14)
    ]
    assert seen == pytest.approx(expected)
    assert seen[13] == pytest.approx(0.0) and math.isclose(seen[2], 2.0)
