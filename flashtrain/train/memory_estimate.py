"""Per-GPU memory of a training step, from the shapes alone: arithmetic, not a measurement.

Used by a dry run's summary (trainer.max_steps=0) and by the context-parallel scaling model
(flashtrain/lab/bench/cp_scaling.py). Counted, per GPU:

    states       16 bytes per parameter (fp32 weights and gradients, AdamW's two fp32 moments),
                 sharded by FSDP2 (over every rank, or hsdp's shard group), whole on every
                 rank otherwise
    activations  the peak of one micro-batch's forward and backward, term by term, with
                 recomputation, offload, tiling and the context-parallel mode
                 (activation_memory.py); offloaded block inputs are host memory, per rank
Not counted: FSDP2's gathered weights of the block in hand, the allocator's slack and the CUDA
context.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flashtrain.train.activation_memory import ActivationPlan, LayerShapes, activation_memory
from flashtrain.train.distributed import is_sharded

GIB = 2**30
STATE_BYTES_PER_PARAM = 16  # fp32 weights + fp32 gradients + AdamW exp_avg + exp_avg_sq


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU."""

    states: float
    activations: float  # with the configured recomputation
    activations_other: float  # with the other choice (all <-> none)
    other_recompute: str  # what activations_other assumed: "all" or "none"
    precision: str = "bf16"  # the run's, which set the activations' bytes
    host_per_rank: float = 0.0  # offloaded block inputs in host memory, per rank
    terms: dict[str, float] = field(default_factory=dict)  # activations by term
    gathered: float = 0.0  # FSDP2: the block in hand's gathered weights, the next one's, grads

    @property
    def total(self) -> float:
        return self.states + self.activations + self.gathered


def estimate_memory(
    *,
    params: int,
    shapes: LayerShapes,
    plan: ActivationPlan,
    state_shards: int,
    precision: str = "bf16",
    gathered: float = 0.0,
) -> MemoryEstimate:
    """One GPU's memory for a micro-batch (plan.tokens tokens: micro_batch_size x seq_len /
    context_parallel), the states sharded over state_shards ranks (the world under fsdp, the
    shard group under hsdp, else 1); activations by activation_memory.activation_memory, and
    with the other choice of recomputation (all <-> none) for comparison."""
    mine = activation_memory(shapes, plan)
    other_mode = "none" if plan.recomputed else "all"
    other = replace(
        plan, recompute=other_mode, recomputed=shapes.n_layer if plan.recomputed == 0 else 0
    )
    return MemoryEstimate(
        states=STATE_BYTES_PER_PARAM * params / state_shards,
        activations=mine.device,
        activations_other=activation_memory(shapes, other).device,
        other_recompute=other_mode,
        precision=precision,
        host_per_rank=mine.host,
        terms=mine.terms,
        gathered=gathered,
    )


@dataclass(frozen=True)
class BuildMemory:
    """Bytes per rank while the model is built, placed and given its initial weights."""

    device: float
    host: float
    how: str  # what the figures assume, for the summary


def estimate_build_memory(
    *, params: int, largest_tensor: int, strategy: str, shards: int
) -> BuildMemory:
    """The peak per rank of building on the meta device and materialising on a GPU
    (models/materialize.py). FSDP2 (fsdp, hsdp; the weights split over `shards` ranks): on the
    device, each rank's fp32 shards; on the host, one tensor at most (the rows being read pass
    through it; a positional table to resize is read whole). One process or DDP: the whole fp32 model, initialised on the host (bit for bit a
    CPU-built model's) and copied to the device. Checkpoint files are memory-mapped: their
    pages are the page cache's, not counted."""
    whole = 4.0 * params
    if is_sharded(strategy):
        return BuildMemory(
            device=whole / shards,
            host=4.0 * largest_tensor,
            how=f"FSDP2: the fp32 shards of {shards} ranks; one tensor on the host",
        )
    return BuildMemory(device=whole, host=whole, how="the whole fp32 model, on host and device")


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f} GiB"
