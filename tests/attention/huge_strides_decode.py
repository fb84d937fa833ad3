"""flash_attn_with_kvcache (and the decode launcher) on views whose element offsets pass 2^31,
on a storage large only in address space (as huge_strides.py does for flash_attn_func): the
call touches a few pages of it, about a MiB (issue 25.10).

    python huge_strides_decode.py cache-heads  # head-major cache and query: head 2 past 2^31
    python huge_strides_decode.py q-rows       # 300 query rows 2^23 - 64 elements apart
    python huge_strides_decode.py out-heads    # flash_decode writing a head-major output
    python huge_strides_decode.py cache-heads q-rows   # several in one process

Run in a subprocess by test_kvcache_inputs.py: with int32 offsets the interpreter read outside
the storage (a crash, or garbage). Prints one JSON line: the largest error per split count
against a float64 reference on compact copies, per layout.
"""

import json
import sys

import torch

from flashtrain.attention import flash_attn_with_kvcache
from flashtrain.attention.reference import attention_reference

HEAD_STRIDE = 2**30 + 64  # head 2 starts 2^31 + 128 elements in
ROW_STRIDE = 2**23 - 64  # the largest row stride allowed, rounded down: row 257 passes 2^31
CACHE_LEN, LENGTH, DIM = 40, 37, 16


def _random_view(storage, shape, strides, offset=0):
    """A view of `storage` filled with random values (touching only its own pages)."""
    view = storage.as_strided(shape, strides, offset)
    view.copy_(torch.randn(shape, dtype=storage.dtype))
    return view


def _reference(q, k, v, causal):
    out, _ = attention_reference(q.double(), k.double(), v.double(), causal=causal)
    return out


def cache_heads() -> dict:
    """q (1, 2, 3, D) and the cache (1, 40, 3, D) as head-major views of one storage; k = v."""
    storage = torch.empty(2 * HEAD_STRIDE + (CACHE_LEN + 2) * DIM, dtype=torch.float16)
    strides = (0, DIM, HEAD_STRIDE, 1)
    cache = _random_view(storage, (1, CACHE_LEN, 3, DIM), strides)
    q = _random_view(storage, (1, 2, 3, DIM), strides, offset=CACHE_LEN * DIM)
    want = _reference(q, cache[:, :LENGTH], cache[:, :LENGTH], causal=True)
    errors = {}
    for splits in (1, 3):
        out = flash_attn_with_kvcache(
            q, cache, cache, cache_seqlens=LENGTH, causal=True, num_splits=splits
        )
        errors[f"splits={splits}"] = (out.double() - want).abs().max().item()
    return errors


def q_rows() -> dict:
    """A chunk of 300 queries (1, 300, 1, D) whose rows are ROW_STRIDE apart, against a compact
    cache (non-causal: every row sees every key)."""
    storage = torch.empty(300 * ROW_STRIDE, dtype=torch.float16)
    q = _random_view(storage, (1, 300, 1, DIM), (0, ROW_STRIDE, DIM, 1))
    assert ROW_STRIDE * 299 >= 2**31
    cache = torch.randn(1, CACHE_LEN, 1, DIM, dtype=torch.float16)
    want = _reference(q, cache[:, :LENGTH], cache[:, :LENGTH], causal=False)
    errors = {}
    for splits in (1, 3):
        out = flash_attn_with_kvcache(q, cache, cache, cache_seqlens=LENGTH, num_splits=splits)
        errors[f"splits={splits}"] = (out.double() - want).abs().max().item()
    return errors


def out_heads() -> dict:
    """flash_decode (below the API, where the caller owns out) writing a head-major output."""
    from flashtrain.kernels.common import UNBOUNDED
    from flashtrain.kernels.flash_decode import flash_decode

    storage = torch.empty(2 * HEAD_STRIDE + 2 * DIM, dtype=torch.float16)
    out = storage.as_strided((1, 2, 3, DIM), (0, DIM, HEAD_STRIDE, 1))
    q = torch.randn(1, 2, 3, DIM, dtype=torch.float16)
    cache = torch.randn(1, CACHE_LEN, 3, DIM, dtype=torch.float16)
    want = _reference(q, cache[:, :LENGTH], cache[:, :LENGTH], causal=True)
    errors = {}
    for splits in (1, 3):
        out.fill_(float("nan"))
        flash_decode(
            q, cache, cache, out, torch.empty(1, 3, 2), torch.tensor([LENGTH], dtype=torch.int32),
            cache_batch_idx=None, softmax_scale=DIM**-0.5, window_left=UNBOUNDED, window_right=0,
            num_splits=splits,
        )  # fmt: skip
        errors[f"splits={splits}"] = (out.double() - want).abs().max().item()
    return errors


if __name__ == "__main__":
    torch.manual_seed(0)
    runs = {"cache-heads": cache_heads, "q-rows": q_rows, "out-heads": out_heads}
    errors = {}
    for name in sys.argv[1:]:
        errors.update({f"{name} {key}": value for key, value in runs[name]().items()})
    print(json.dumps(errors))
