"""The arithmetic behind a dry run's plan and memory estimate (flashtrain/train/dry_run.py,
memory_estimate.py); the presets' own numbers: tests/train/test_llama_train.py."""

from __future__ import annotations

import pytest

from flashtrain.train.dry_run import planned_world
from flashtrain.train.memory_estimate import activation_bytes_per_token, block_activation_bytes


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
