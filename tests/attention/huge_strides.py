"""Attention on views whose element offsets pass 2^31 within one batch element, on a storage
that is large only in address space: torch.empty leaves its pages unmapped, and the call reads
a few hundred of them, so the process touches about a MiB (issue 25.10).

    python huge_strides.py rows    # (S, H, D) rows 2^23 - 64 elements apart: tiles from row 272 start past 2^31
    python huge_strides.py heads   # a head-major view: head 2 starts past 2^31

Run in a subprocess by test_int32_limits.py: before the kernels used int64 offsets, an offset
wrapped to a negative int32 and the interpreter read outside the storage (a crash, or garbage).
Prints one JSON line with the largest errors (deterministic backward and not) against a float64 reference on a compact copy.
"""

import json
import sys

import torch

from flashtrain.attention import flash_attn_func
from flashtrain.attention.reference import attention_reference

# (seqlen, heads, head_dim, strides of the (S, H, D) view in elements, elements of storage)
LAYOUTS = {
    "rows": (300, 1, 16, (2**23 - 64, 16, 1), 300 * (2**23 - 64)),
    "heads": (40, 3, 16, (16, 2**30 + 64, 1), 2 * (2**30 + 64) + 40 * 16),
}


def main(name: str) -> None:
    seqlen, heads, head_dim, strides, elements = LAYOUTS[name]
    storage = torch.empty(elements, dtype=torch.float16)  # untouched: no physical memory yet
    view = storage.as_strided((1, seqlen, heads, head_dim), (0, *strides))
    assert max(strides[0] * (seqlen - 1), strides[1] * (heads - 1)) >= 2**31
    torch.manual_seed(0)
    view.copy_(torch.randn(view.shape, dtype=torch.float16))  # touches only the view's pages
    compact = view.detach().clone()
    x = view.detach().requires_grad_()  # a leaf sharing the big storage; its grad is compact
    dout = torch.randn(view.shape, dtype=torch.float16)
    ref_x = compact.double().requires_grad_()
    ref, _ = attention_reference(ref_x, ref_x, ref_x, causal=True)
    ref.backward(dout.double())
    errors = {}
    for deterministic in (False, True):  # dQ by atomics in the dK/dV kernel, or its own kernel
        x.grad = None
        out = flash_attn_func(x, x, x, causal=True, deterministic=deterministic)
        out.backward(dout)
        errors[f"out/{deterministic}"] = (out.double() - ref).abs().max().item()
        errors[f"grad/{deterministic}"] = (x.grad.double() - ref_x.grad).abs().max().item()
    print(json.dumps(errors))


if __name__ == "__main__":
    main(sys.argv[1])
