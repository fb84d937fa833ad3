"""Public attention API: exact FlashAttention (dense, varlen, block-sparse) on Triton kernels."""

from flashtrain.attention import sparsity
from flashtrain.attention.api import blocksparse_attn_func, flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.padding import pad_input, unpad_input

__all__ = [
    "blocksparse_attn_func",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "pad_input",
    "sparsity",
    "unpad_input",
]
