"""Public attention API: exact FlashAttention (dense, varlen, block-sparse) on Triton kernels,
with flash-attn's function names and argument order."""

from flashtrain.attention import sparsity
from flashtrain.attention.api import blocksparse_attn_func, flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashtrain.attention.padding import pad_input, unpad_input

__all__ = [
    "blocksparse_attn_func",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "pad_input",
    "sparsity",
    "unpad_input",
]
