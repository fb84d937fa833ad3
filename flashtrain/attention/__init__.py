"""Public attention API: exact FlashAttention (dense, varlen, block-sparse) on Triton kernels."""

from flashtrain.attention.api import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.padding import pad_input, unpad_input

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "pad_input", "unpad_input"]
