"""Which part of a training step a GPU kernel or a host op belongs to, for step_split.py.

A kernel (or op) is bucketed by its own name first: GEMM libraries, attention kernels (ours and
PyTorch SDPA's), loss kernels, NCCL, copies and the multi-tensor optimizer kernels say what they
are. A generic name (an elementwise or reduction kernel, an Inductor triton_poi_/triton_red_/
triton_per_ fusion) says nothing, so the op or range that launched it decides: the innermost
enclosing one that names a part (inside flashtrain::loss: loss), else "elementwise".
"""

from __future__ import annotations

import re

# The fixed buckets of a step, in report order; idle is the step's time with nothing running.
BUCKETS = (
    "matmul",
    "attention",
    "loss",
    "elementwise",
    "optimizer",
    "communication",
    "memcpy",
    "data",
    "idle",
)
MEMCPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")  # Chrome-trace categories of the copy engine


def _rule(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.IGNORECASE)


# Kernel and op names; the first matching rule wins (attention before matmul: cuDNN's SDPA and
# the memory-efficient kernels carry sm90_/wgmma/cutlass in their names too).
NAME_RULES = (
    (
        "attention",
        _rule(
            # flashtrain's Triton/Gluon kernels (kernels/: flash_*, the dropout mask, the
            # Gluon backward's schedule probe)
            r"^flash_|^dropout_mask_kernel$|^schedule_probe_kernel$"
            # PyTorch SDPA: FlashAttention-2, cuDNN, memory-efficient; their ATen ops on CPU
            r"|pytorch_flash::|flash_fwd|flash_bwd|fmha|sdpa|attention|attn|scaled_dot_product"
        ),
    ),
    # flashtrain's fused LM-head loss (kernels/linear_cross_entropy.py: xent_*), ATen's and
    # Liger-Kernel's cross-entropy (liger_cross_entropy_kernel), and Inductor's fusions of them
    ("loss", _rule(r"xent_|cross_?entropy|nll_?loss|log_?softmax")),
    (
        "matmul",
        _rule(
            r"gemm|gemv|nvjet|cutlass|xmma|wgmma|(^|_)sm\d{2,3}_|cublas|splitkreduce"
            r"|^triton_tem_fused\w*mm"  # Inductor's GEMM templates
            r"|^aten::(mm|addmm_?|bmm|baddbmm_?|addbmm|matmul|linear|_addmm_activation|mv|dot)$"
        ),
    ),
    ("communication", _rule(r"nccl|^c10d::|^gloo:|all_?reduce|all_?gather|reduce_?scatter")),
    ("memcpy", _rule(r"^memcpy|^memset")),
    # multi-tensor kernels: the fused/foreach optimizers and gradient clipping's norms
    ("optimizer", _rule(r"multi_tensor_apply|fused_?adam|_foreach_")),
)

# Names of the ops and ranges that decide a generic kernel's bucket.
CONTEXT_RULES = (
    (
        "attention",
        # the custom ops (flashtrain/attention/ops.py, kvcache_op.py), their autograd node
        # (GeneratedBackwardFor_flashtrain_attention_forward_default...), and SDPA
        _rule(
            r"^flashtrain::(attention|kvcache_attention)|flashtrain_attention"
            r"|scaled_?dot_?product|flash_?attention|efficient_?attention"
        ),
    ),
    (
        "loss",
        # the model's loss range, the fused-loss custom ops, cross-entropy ops/autograd nodes
        _rule(r"^flashtrain::(loss|linear_xent)|xent|cross_?entropy|nll_?loss|log_?softmax"),
    ),
    ("optimizer", _rule(r"^Optimizer\.step")),  # torch.optim's Optimizer.step#AdamW.step
    ("data", _rule(r"^flashtrain::data")),
)


def bucket_by_name(name: str, category: str = "kernel") -> str | None:
    """The bucket a kernel's or op's own name names; None: a generic name."""
    if category in MEMCPY_CATEGORIES:
        return "memcpy"
    for bucket, pattern in NAME_RULES:
        if pattern.search(name):
            return bucket
    return None


def bucket_by_context(ancestors: list[str]) -> str | None:
    """The bucket of the innermost enclosing op or range (ancestors innermost first) that names
    one; None: none does."""
    for name in ancestors:
        for bucket, pattern in CONTEXT_RULES:
            if pattern.search(name):
                return bucket
    return None


def bucket_of(name: str, ancestors: list[str], category: str = "kernel") -> str:
    """A kernel's (or op's) bucket: its name, else the op that launched it, else elementwise."""
    return bucket_by_name(name, category) or bucket_by_context(ancestors) or "elementwise"
