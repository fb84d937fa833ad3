"""The route an attention call takes: the Triton kernels or the PyTorch path."""

from __future__ import annotations

import os

import torch

from flashtrain.kernels.interpreter_compat import prepare_interpreter

ROUTES = ("triton", "torch")
CPU_ROUTE_CHOICES = ("auto", *ROUTES)  # FLASHTRAIN_CPU_ATTENTION's values


def route_for(device: torch.device) -> str:
    """ "triton" or "torch". CUDA: always Triton. CPU: Triton under TRITON_INTERPRET=1, else the
    PyTorch path.

    FLASHTRAIN_CPU_ATTENTION=auto|triton|torch overrides the CPU choice (auto = the rule above).
    A Triton route under TRITON_INTERPRET=1 first makes sure the interpreter can run here
    (flashtrain.kernels.interpreter_compat), or raises RuntimeError saying what to install.
    """
    route = _choose(device)
    if route == "triton":
        prepare_interpreter()  # a no-op unless TRITON_INTERPRET=1 (CUDA tensors included)
    return route


def _choose(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    choice = os.environ.get("FLASHTRAIN_CPU_ATTENTION", "auto").lower()
    if choice not in CPU_ROUTE_CHOICES:
        raise ValueError(
            f"FLASHTRAIN_CPU_ATTENTION={choice!r}; allowed: {', '.join(CPU_ROUTE_CHOICES)}"
        )
    if choice == "torch":
        return "torch"
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if choice == "triton" and not interpreted:
        raise ValueError(
            "FLASHTRAIN_CPU_ATTENTION=triton needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return "triton" if interpreted else "torch"
