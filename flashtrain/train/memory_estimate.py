"""Per-GPU memory of a training step, from the shapes alone: arithmetic, not a measurement.

Used by a dry run's summary (trainer.max_steps=0) and by the context-parallel scaling model
(flashtrain/lab/bench/cp_scaling.py). Counted, per GPU:

    states       16 bytes per parameter (fp32 weights and gradients, AdamW's two fp32 moments),
                 sharded over every rank by FSDP2, whole on every rank otherwise
    activations  what the blocks keep for the backward pass of one micro-batch, per token:
                 Korthikanti et al. 2022 ("Reducing Activation Recomputation") with the S x S
                 terms gone (FlashAttention keeps O(S) per head: its output and log-sum-exp);
                 a recomputed block keeps only its input, and one block's working set exists at
                 a time while it is recomputed
Not counted: the logits (the fused LM-head loss never holds them), FSDP2's gathered weights of
the block in hand, the allocator's slack and the CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
STATE_BYTES_PER_PARAM = 16  # fp32 weights + fp32 gradients + AdamW exp_avg + exp_avg_sq


def block_activation_bytes(
    d_model: int,
    d_ff: int,
    *,
    kv_dim: int | None = None,
    mlp_widths: int = 2,
    act_bytes: int = 2,
    residual_bytes: int = 2,
    dropout_masks: bool = False,
) -> float:
    """Bytes per token one block keeps for its backward pass (no recomputation).

    In act_bytes each (the matmuls' dtype): the attention's input, q, k and v (kv_dim wide each
    with grouped-query attention), its output (also the out-projection's input), the MLP's input
    and mlp_widths tensors d_ff wide (GELU: its input and output, 2; SwiGLU: gate, up, silu(gate)
    and their product, 4). In residual_bytes: the two norms' inputs (the residual stream).
    dropout_masks: one byte per element for the two residual-branch dropouts. A GPT-2 block in
    16-bit with dropout is Korthikanti's 34 d (without the S x S terms)."""
    kv = d_model if kv_dim is None else kv_dim
    attention = act_bytes * (3 * d_model + 2 * kv)
    mlp = act_bytes * (d_model + mlp_widths * d_ff)
    norms = 2 * residual_bytes * d_model
    masks = 2 * d_model if dropout_masks else 0
    return attention + mlp + norms + masks


def activation_bytes_per_token(
    n_layer: int, d_model: int, block_bytes: float, recomputed: int, residual_bytes: int = 2
) -> float:
    """Summed over the layers: `recomputed` of the n_layer blocks keep only their input
    (residual_bytes * d_model), the others their whole working set (block_bytes); with any
    block recomputed, one block's working set on top (the one being recomputed)."""
    if not 0 <= recomputed <= n_layer:
        raise ValueError(f"recomputed={recomputed} blocks of {n_layer}")
    kept = (n_layer - recomputed) * block_bytes + recomputed * residual_bytes * d_model
    return kept + (block_bytes if recomputed else 0)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU."""

    states: float
    activations: float  # with the configured recomputation
    activations_other: float  # with the other choice (all <-> none)
    other_recompute: str  # what activations_other assumed: "all" or "none"
    precision: str = "bf16"  # the run's, which set the activations' bytes

    @property
    def total(self) -> float:
        return self.states + self.activations


def estimate_memory(
    *,
    params: int,
    n_layer: int,
    d_model: int,
    d_ff: int,
    kv_dim: int,
    mlp_widths: int,
    tokens_per_gpu: int,
    recomputed: int,
    state_shards: int,
    act_bytes: int,
    residual_bytes: int,
    dropout_masks: bool = False,
    precision: str = "bf16",
) -> MemoryEstimate:
    """One GPU's memory for a micro-batch of tokens_per_gpu tokens (micro_batch_size x seq_len
    / context_parallel), the states sharded over state_shards ranks (the world under FSDP2,
    else 1), `recomputed` of the n_layer blocks recomputed."""
    block = block_activation_bytes(
        d_model, d_ff, kv_dim=kv_dim, mlp_widths=mlp_widths, act_bytes=act_bytes,
        residual_bytes=residual_bytes, dropout_masks=dropout_masks,
    )  # fmt: skip

    def activations(blocks_recomputed: int) -> float:
        per_token = activation_bytes_per_token(
            n_layer, d_model, block, blocks_recomputed, residual_bytes
        )
        return per_token * tokens_per_gpu

    other = 0 if recomputed else n_layer
    return MemoryEstimate(
        states=STATE_BYTES_PER_PARAM * params / state_shards,
        activations=activations(recomputed),
        activations_other=activations(other),
        other_recompute="none" if recomputed else "all",
        precision=precision,
    )


@dataclass(frozen=True)
class BuildMemory:
    """Bytes per rank while the model is built, placed and given its initial weights."""

    device: float
    host: float
    how: str  # what the figures assume, for the summary


def estimate_build_memory(
    *, params: int, largest_tensor: int, strategy: str, world_size: int
) -> BuildMemory:
    """The peak per rank of building on the meta device and materialising on a GPU
    (models/materialize.py). FSDP2: on the device, each rank's fp32 shards; on the host, one
    tensor at most (the rows being read pass through it; a positional table to resize is read
    whole). One process or DDP: the whole fp32 model, initialised on the host (bit for bit a
    CPU-built model's) and copied to the device. Checkpoint files are memory-mapped: their
    pages are the page cache's, not counted."""
    whole = 4.0 * params
    if strategy == "fsdp":
        return BuildMemory(
            device=whole / world_size,
            host=4.0 * largest_tensor,
            how=f"FSDP2: the fp32 shards of {world_size} ranks; one tensor on the host",
        )
    return BuildMemory(device=whole, host=whole, how="the whole fp32 model, on host and device")


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f} GiB"
