"""A scaling model for context parallelism (ring attention): the longest context GPT-2 can
train on P GPUs, and when the ring's communication hides behind attention's compute.

A model, not a measurement: every constant is an argument. See docs/context_parallel.md for the
formulas. Example: python scripts/cp_scaling_model.py --peak-tflops 989 --efficiency 0.5
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from flashtrain.train import activation_memory
from flashtrain.train.memory_estimate import GIB, STATE_BYTES_PER_PARAM


@dataclass(frozen=True)
class Model:
    name: str
    n_layer: int
    d_model: int
    vocab: int = 50257

    @property
    def params(self) -> float:
        """Weights: 12 d^2 per block plus the (tied) embedding."""
        return 12 * self.n_layer * self.d_model**2 + self.vocab * self.d_model


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus: int
    link_gb_s: float  # bytes each GPU sends to its ring neighbour per second, in GB/s


MODELS = (Model("GPT-2 small", 12, 768), Model("GPT-2 medium", 24, 1024))
CLUSTERS = (
    Cluster("8 x H100, NVLink", 8, 450.0),
    Cluster("64 x H100, InfiniBand 400 Gb/s", 64, 50.0),
)


def activation_bytes_per_token(model: Model, recompute: bool) -> float:
    """Per token, summed over layers, bf16 (flashtrain/train/activation_memory.py, the trainer's
    dry-run estimate): without recomputation a GPT-2 block keeps 34 d bytes per token
    (Korthikanti et al. 2022, with FlashAttention's S x S term gone); with full recomputation
    only each block's input (2 d bytes) plus one block's working set."""
    d, layers = model.d_model, model.n_layer
    block = activation_memory.block_activation_bytes(d, 4 * d, dropout_masks=True)  # 34 d
    return activation_memory.activation_bytes_per_token(
        layers, d, block, layers if recompute else 0
    )


def max_context(model: Model, cluster: Cluster, memory_gib: float, recompute: bool) -> int:
    """The longest sequence (batch 1) whose activations fit after FSDP-sharded weights and
    optimizer state (16 bytes per parameter: bf16 weights and gradients, fp32 master and Adam
    moments), with the LM head's loss fused (no logits in memory)."""
    free = memory_gib * GIB - STATE_BYTES_PER_PARAM * model.params / cluster.gpus
    per_token = activation_bytes_per_token(model, recompute) + 8  # + the loss's saved lse
    return int(free / per_token) * cluster.gpus


def hiding_threshold(
    cluster: Cluster, peak_tflops: float, efficiency: float, causal: bool
) -> float:
    """Tokens per rank S/P above which a ring step's attention compute outlasts sending its K and V.

    A step computes 4 (S/P)^2 d FLOPs (half of it when causal, zigzag-balanced) and sends
    2 (S/P) d bf16 values (K and V: 4 (S/P) d bytes), so compute >= transfer when
    S/P >= efficiency * peak / bandwidth (FLOP per byte), twice that when causal."""
    flop_per_byte = efficiency * peak_tflops * 1e12 / (cluster.link_gb_s * 1e9)
    return flop_per_byte * (2 if causal else 1)


def attention_seconds(
    model: Model, cluster: Cluster, seq: int, peak_tflops: float, efficiency: float
) -> float:
    """One causal training step's attention time for one sequence of seq tokens spread over the
    cluster: 4 S^2 d FLOPs per layer forward, halved by causality, x3.5 for forward + backward."""
    flops = 3.5 * 0.5 * 4 * seq**2 * model.d_model * model.n_layer
    return flops / (cluster.gpus * efficiency * peak_tflops * 1e12)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-gib", type=float, default=72.0, help="usable GPU memory (of 80)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100 SXM)")
    p.add_argument(
        "--efficiency", type=float, default=0.5, help="fraction of peak attention runs at"
    )
    args = p.parse_args()

    print(f"model: {args.memory_gib:g} GiB usable, bf16 peak {args.peak_tflops:g} TFLOP/s at "
          f"{args.efficiency:.0%}\n")  # fmt: skip
    print(
        "| model | cluster | recompute | longest context | tokens per GPU | ring hidden (causal) "
        "| attention s/step |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in MODELS:
        for cluster in CLUSTERS:
            threshold = hiding_threshold(cluster, args.peak_tflops, args.efficiency, causal=True)
            for recompute in (False, True):
                seq = max_context(model, cluster, args.memory_gib, recompute)
                per_gpu = seq // cluster.gpus
                hidden = "yes" if per_gpu >= threshold else f"no (needs >= {threshold:,.0f})"
                secs = attention_seconds(model, cluster, seq, args.peak_tflops, args.efficiency)
                print(f"| {model.name} | {cluster.name} | {'full' if recompute else 'none'} | "
                      f"{seq / 1e6:.2f}M | {per_gpu:,} | {hidden} | {secs:,.0f} |")  # fmt: skip
    print()
    for cluster in CLUSTERS:
        for causal in (False, True):
            t = hiding_threshold(cluster, args.peak_tflops, args.efficiency, causal)
            print(f"{cluster.name}: communication hidden from {t:,.0f} tokens per GPU "
                  f"({'causal' if causal else 'non-causal'})")  # fmt: skip


if __name__ == "__main__":
    main()
