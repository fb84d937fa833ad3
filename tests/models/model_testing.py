"""Shared pieces of the model tests: tiny configs, config loading, a CPU peak-memory meter."""

from __future__ import annotations

import torch
from config_testing import compose
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Tiny shapes for the Triton interpreter: head_dim 32, seq <= 64, 2 layers.
TINY_GPT2 = dict(arch="gpt2", n_layer=2, n_head=2, d_model=64, max_seq_len=64, vocab_size=97)
TINY_BERT = dict(
    arch="bert",
    n_layer=2,
    n_head=2,
    d_model=64,
    d_ff=128,
    max_seq_len=64,
    vocab_size=97,
    dropout=0.0,
    attn_dropout=0.0,
)
TINY_CLASSIFIER = dict(
    arch="classifier", n_layer=2, n_head=2, d_model=64, d_ff=128, max_seq_len=64, dropout=0.0
)


def load_model_config(name: str, seq_len: int, vocab_size: int, num_classes: int | None = None):
    """configs/model/<name>.yaml composed the way train.py composes it (model=<name>), with the
    vocabulary (and classes) the data would give it."""
    model = compose([f"model={name}", f"seq_len={seq_len}"]).model
    model.vocab_size = vocab_size
    if "num_classes" in model:
        model.num_classes = num_classes
    return model


def load_attention_config(name: str):
    return compose([f"attention={name}"]).attention


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class PeakMemory(TorchDispatchMode):
    """Peak bytes of tensor storage alive at once among those created while active (CPU).

    Every op's outputs are tracked through weak references to their storages; after each op the
    expired ones are dropped and the live total is compared with the peak. Parameters and tensors
    created before entering are not counted. Works through the backward pass on CPU, where the
    autograd engine runs on the calling thread.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def current(self) -> int:
        self.live = {k: (r, n) for k, (r, n) in self.live.items() if not r.expired()}
        return sum(n for _, n in self.live.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref.cdata not in self.live or self.live[ref.cdata][0].expired():
                    self.live[ref.cdata] = (ref, st.nbytes())
        self.peak = max(self.peak, self.current())
        return out
