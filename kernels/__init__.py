"""Triton device code: @triton.jit kernels and their launch functions. No autograd, no modules."""
