"""flashtrain: long-context GPT-2 / BERT training on the project's own Triton FlashAttention."""

__version__ = "0.1.0"
