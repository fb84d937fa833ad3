"""Which implementation runs an attention call: the Triton kernels or the PyTorch path."""

from __future__ import annotations

import os

import torch

CHOICES = ("auto", "triton", "torch")


def use_triton(device: torch.device) -> bool:
    """CUDA: always Triton. CPU: Triton under TRITON_INTERPRET=1, else the PyTorch path.

    FLASHTRAIN_CPU_ATTENTION=auto|triton|torch overrides the CPU choice (auto = the rule above).
    """
    if device.type == "cuda":
        return True
    choice = os.environ.get("FLASHTRAIN_CPU_ATTENTION", "auto").lower()
    if choice not in CHOICES:
        raise ValueError(f"FLASHTRAIN_CPU_ATTENTION={choice!r}; allowed: {', '.join(CHOICES)}")
    if choice == "torch":
        return False
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if choice == "triton" and not interpreted:
        raise ValueError(
            "FLASHTRAIN_CPU_ATTENTION=triton needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return interpreted
