"""The route an attention call takes: the Triton kernels or the PyTorch path.

One rule beside the device: Triton's interpreter computes tl.dot on bfloat16 operands wrong (off by
~8e8 with no warning; upstream, seen on triton 3.9), so no bfloat16 product of a CPU tensor is
ever computed there. Attention routes such calls to the PyTorch path (or refuses a forced Triton
route); the fused loss (flashtrain.models.fused_cross_entropy) to its chunked path.
"""

from __future__ import annotations

import os

import torch

from flashtrain.kernels.interpreter_compat import prepare_interpreter

ROUTES = ("triton", "torch")
CPU_ROUTE_CHOICES = ("auto", *ROUTES)  # FLASHTRAIN_CPU_ATTENTION's values
INTERPRETER_WRONG_DTYPES = (torch.bfloat16,)  # the interpreter's tl.dot miscomputes these


def interpreted() -> bool:
    """Whether Triton kernels run under the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_miscomputes(device: torch.device, dtype: torch.dtype) -> bool:
    """True where a kernel on `dtype` tensors of `device` would run its products under the
    interpreter and get them wrong: CPU tensors of INTERPRETER_WRONG_DTYPES under TRITON_INTERPRET=1.
    CUDA tensors always take the kernels (there is no other route there)."""
    return device.type == "cpu" and interpreted() and dtype in INTERPRETER_WRONG_DTYPES


def route_for(operand: torch.Tensor) -> str:
    """ "triton" or "torch" for an op on tensors like `operand` (choose_route), the interpreter
    made ready for a Triton route: under TRITON_INTERPRET=1 it first makes sure the interpreter
    can run here (flashtrain.kernels.interpreter_compat), or raises RuntimeError saying what to
    install."""
    route = choose_route(operand)
    if route == "triton":
        prepare_interpreter()  # a no-op unless TRITON_INTERPRET=1 (CUDA tensors included)
    return route


def choose_route(operand: torch.Tensor) -> str:
    """ "triton" or "torch" for an op on tensors like `operand` (q: its device and dtype decide),
    with no side effect (so an op can be refused before it writes anything).
    CUDA: always Triton. CPU: Triton under TRITON_INTERPRET=1, else the PyTorch path; bfloat16
    under the interpreter: the PyTorch path (interpreter_miscomputes).

    FLASHTRAIN_CPU_ATTENTION=auto|triton|torch overrides the CPU choice (auto = the rule above);
    triton on bfloat16 under the interpreter raises ValueError rather than compute garbage.
    """
    route = _choose(operand.device)
    if route == "triton" and interpreter_miscomputes(operand.device, operand.dtype):
        if _cpu_choice() == "triton":
            raise ValueError(
                f"FLASHTRAIN_CPU_ATTENTION=triton cannot run {operand.dtype} CPU tensors: the "
                "Triton interpreter computes bfloat16 products wrong (tl.dot, upstream); use "
                "FLASHTRAIN_CPU_ATTENTION=auto or torch (the PyTorch path), or float16/float32"
            )
        route = "torch"
    return route


def _cpu_choice() -> str:
    choice = os.environ.get("FLASHTRAIN_CPU_ATTENTION", "auto").lower()
    if choice not in CPU_ROUTE_CHOICES:
        raise ValueError(
            f"FLASHTRAIN_CPU_ATTENTION={choice!r}; allowed: {', '.join(CPU_ROUTE_CHOICES)}"
        )
    return choice


def _choose(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    choice = _cpu_choice()
    if choice == "torch":
        return "torch"
    if choice == "triton" and not interpreted():
        raise ValueError(
            "FLASHTRAIN_CPU_ATTENTION=triton needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return "triton" if interpreted() else "torch"
