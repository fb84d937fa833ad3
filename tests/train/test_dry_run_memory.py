"""The arithmetic behind a dry run's plan and memory estimate (flashtrain/train/dry_run.py,
memory_estimate.py); the presets' own numbers: tests/train/test_llama_train.py."""

from __future__ import annotations

import pytest

from flashtrain.train.activation_memory import activation_bytes_per_token, block_activation_bytes
from flashtrain.train.config import BatchPlan
from flashtrain.train.dry_run import gpu_step_line, planned_world


@pytest.mark.parametrize(
    "world, cp, planned",
    [(1, 1, 1), (1, 8, 8), (2, 8, 8), (8, 8, 8), (12, 8, 16), (4, 2, 4), (3, 2, 4)],
)
def test_dry_run_plans_for_the_smallest_world_context_parallel_divides(world, cp, planned):
    assert planned_world(world, cp) == planned


@pytest.mark.parametrize("d", [768, 1024])
def test_dry_run_block_estimate_is_korthikantis_count(d):
    """A GPT-2 block (MLP 4d wide, GELU) in 16-bit with its two dropout masks keeps 34 d bytes
    per token once FlashAttention removes the S x S terms (Korthikanti et al. 2022, Table 2:
    sbh (34 + 5 as/h)); without dropout 32 d; grouped K/V heads and SwiGLU's four d_ff-wide
    tensors counted as they are."""
    assert block_activation_bytes(d, 4 * d, dropout_masks=True) == 34 * d
    assert block_activation_bytes(d, 4 * d) == 32 * d
    assert block_activation_bytes(d, 4 * d, kv_dim=d // 4) == 32 * d - 2 * 2 * (d - d // 4)
    assert block_activation_bytes(d, 3 * d, mlp_widths=4) == 2 * (5 * d + d + 12 * d) + 4 * d


def test_dry_run_recomputation_keeps_block_inputs_and_one_working_set():
    block, d = 1000.0, 10
    assert activation_bytes_per_token(4, d, block, 0) == 4 * block
    assert activation_bytes_per_token(4, d, block, 4, residual_bytes=2) == 4 * 2 * d + block
    assert (
        activation_bytes_per_token(4, d, block, 2, residual_bytes=4)
        == 2 * block + 2 * 4 * d + block
    )
    with pytest.raises(ValueError, match="recomputed=5 blocks of 4"):
        activation_bytes_per_token(4, d, block, 5)


def test_dry_run_predicts_the_gpu_step_time_at_the_stated_utilisation():
    """8 GPUs, 2 data-parallel groups of 4 (context parallel), 2 micro-batches of 1 at 64K: 4
    sequences = 262,144 tokens a step; at 1 GFLOP a token and 40% of an H100's 989.4 TFLOP/s
    bf16 that is 262,144e9 / (8 x 395.76e12) = 0.083 s, 395.76K tokens/s per GPU."""
    plan = BatchPlan(seq_len=65536, micro_batch_size=1, world_size=8, grad_accum=2,
                     context_parallel=4)  # fmt: skip
    line = gpu_step_line(1e9, plan, "bf16", None)
    assert "40% MFU of 8 x H100 at 989.40TFLOP/s bf16): ~0.1 s, 395.76K tokens/s per GPU" in line
    assert "prediction, not a measurement" in line
    assert gpu_step_line(1e9, plan, "fp32", "NVIDIA A100-SXM4-80GB").endswith("per GPU")
    assert "not in the peak table" in gpu_step_line(1e9, plan, "bf16", "Some Future GPU")
