"""Public attention API: exact FlashAttention (dense, varlen, block-sparse) on Triton kernels,
with flash-attn's function names and argument order, decoding against a KV cache
(flash_attn_with_kvcache, split-KV), and ring attention for sequences split over
the ranks of a process group (ring, Ulysses, or both)."""

from flashtrain.attention import sparsity
from flashtrain.attention.api import blocksparse_attn_func, flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.kvcache import flash_attn_with_kvcache
from flashtrain.attention.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashtrain.attention.padding import pad_input, unpad_input
from flashtrain.attention.ring import ring_attn_func
from flashtrain.attention.ring_sharding import shard_sequence, unshard_sequence
from flashtrain.attention.ulysses import ulysses_attn_func

__all__ = [
    "blocksparse_attn_func",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "pad_input",
    "ring_attn_func",
    "shard_sequence",
    "sparsity",
    "ulysses_attn_func",
    "unpad_input",
    "unshard_sequence",
]
