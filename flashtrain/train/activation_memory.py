"""What one rank holds for a micro-batch's activations, term by term, with recomputation,
activation offload, sequence-tiled layers and each context-parallel mode; and what offload puts
in host memory. Arithmetic from the shapes, not a measurement: calibrated against measured peaks
on CPU (tests/train/test_context_parallel_modes.py: each mode on 4 ranks within +-15%; measured
0.93x-1.05x of the plan).

    saved blocks      blocks not recomputed keep their working set (block_bytes: the attention
                      half's input, normed input, q, k, v and output; the MLP half's input, and
                      untiled its normed input and d_ff-wide intermediates)
    block inputs      recomputed blocks keep their input (the residual stream, (t, C)); offload
                      keeps the last block's on the device (and fetches the next one ahead), the
                      others on the host
    the peak moment   the largest of: the last block's MLP backward (its recomputed tensors, the
                      residual gradient in and out, two d_ff-wide gradients of the rows in hand:
                      all tokens, or a tile); its attention backward (the MLP half freed; dout,
                      dq, dk, dv and the mode's own buffers: the ring's float32 dq, K/V pair and
                      float32 dK/dV pair; Ulysses' head-shard gradients and the send and receive
                      buffers of its largest all-to-all; hybrid the larger of the two); the loss
                      at the end of the forward (the final norm, a chunk of float32 logits)
Attention's own working set is the kernels' (on chip on a GPU; the CPU's O(S) PyTorch path in
the calibration).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


MODES = ("none", "ring", "ulysses", "hybrid")


@dataclass(frozen=True)
class LayerShapes:
    """The widths a memory plan needs (a model config's)."""

    n_layer: int
    d_model: int
    d_ff: int
    kv_dim: int
    n_head: int
    mlp_widths: int  # d_ff-wide tensors an MLP keeps (GELU 2, SwiGLU 4)
    vocab: int  # the head's rows (padded)
    loss_chunk: int  # tokens per chunk of the loss's logits


@dataclass(frozen=True)
class ActivationPlan:
    """How a rank runs its micro-batch."""

    tokens: int  # this rank's tokens: micro_batch_size * seq_len / context_parallel
    batch: int  # sequences in the micro-batch
    act_bytes: int  # the matmuls' dtype (2 under bf16 autocast)
    residual_bytes: int  # the residual stream's (the weights' dtype)
    recompute: str  # none | all | every_k | offload
    recomputed: int  # blocks recomputed in the backward
    tile_tokens: int = 0  # sequence-tiled MLP: tokens per tile, 0 = off
    mode: str = "none"  # context parallelism: none | ring | ulysses | hybrid
    ring_size: int = 1
    ulysses_size: int = 1
    dropout_masks: bool = False


@dataclass(frozen=True)
class ActivationMemory:
    """Bytes: the device's peak by term, and the host's (offloaded block inputs)."""

    terms: dict[str, float] = field(default_factory=dict)
    host: float = 0.0

    @property
    def device(self) -> float:
        return sum(self.terms.values())


def _mlp_rows(s: LayerShapes, p: ActivationPlan) -> int:
    """Tokens whose MLP intermediates exist at once: a tile, or all of them."""
    return min(p.tile_tokens, p.tokens) if p.tile_tokens else p.tokens


def _heads_split(p: ActivationPlan) -> int:
    return p.ulysses_size if p.mode in ("ulysses", "hybrid") else 1


def _kv_width(s: LayerShapes, p: ActivationPlan) -> int:
    """K/V width per token as attention holds it: Ulysses repeats K/V heads up to one per rank."""
    head_dim = s.d_model // s.n_head
    return max(s.kv_dim, _heads_split(p) * head_dim)


def _attention_half(s: LayerShapes, p: ActivationPlan) -> float:
    """Bytes per token the attention half of a block keeps: its input (the residual stream),
    the normed input, q, k, v and the output (Ulysses: on head shards, the same bytes, K/V
    repeated), and a dropout mask on its branch."""
    mask = s.d_model if p.dropout_masks else 0
    # Ulysses: the output exists twice, on head shards (the kernel's) and back on the sequence
    # piece (the out-projection's input)
    outputs = 2 if _heads_split(p) > 1 else 1
    matmuls = (2 + outputs) * s.d_model + 2 * _kv_width(s, p)
    return p.residual_bytes * s.d_model + p.act_bytes * matmuls + mask


def _mlp_half(s: LayerShapes, p: ActivationPlan) -> float:
    """Bytes the MLP half keeps for t tokens: its input, and untiled its normed input and
    mlp_widths d_ff-wide intermediates (tiled: the tile's exist only inside its backward)."""
    mask = s.d_model if p.dropout_masks else 0
    kept = p.residual_bytes * s.d_model + mask
    if p.tile_tokens:
        return p.tokens * kept
    return p.tokens * (kept + p.act_bytes * (s.d_model + s.mlp_widths * s.d_ff))


def block_bytes(s: LayerShapes, p: ActivationPlan) -> float:
    """One block's saved tensors for its backward, t tokens."""
    return p.tokens * _attention_half(s, p) + _mlp_half(s, p)


def _attention_backward(s: LayerShapes, p: ActivationPlan) -> float:
    """What attention's backward adds, per rank: dout, dq, dk, dv (Ulysses: on head shards,
    the same bytes); the ring's float32 dq, K/V pair and float32 dK/dV pair; Ulysses' moment
    after the kernel: the head-shard gradients, the send and receive buffers of the largest
    all-to-all (one tensor at a time) and the rank's own gradients coming back."""
    t, a, width, kv = p.tokens, p.act_bytes, s.d_model, 2 * _kv_width(s, p)
    kernel = t * a * (2 * width + kv)
    if p.mode in ("ring", "hybrid"):
        kernel += t * (4 * width + 2 * kv * a + 2 * kv * 4)
    if p.mode not in ("ulysses", "hybrid"):
        return kernel
    alltoall = t * a * ((width + kv) + 2 * width + (width + 2 * s.kv_dim))
    return max(kernel, alltoall)


def activation_memory(s: LayerShapes, p: ActivationPlan) -> ActivationMemory:
    """The device's activation peak of one micro-batch by term, and the host's bytes: the
    largest of three moments: the loss (the end of the forward), the last block's MLP backward
    and its attention backward."""
    if not 0 <= p.recomputed <= s.n_layer:
        raise ValueError(f"recomputed={p.recomputed} blocks of {s.n_layer}")
    t, a, r, width = p.tokens, p.act_bytes, p.residual_bytes, s.d_model
    block = block_bytes(s, p)
    kept_inputs, host, prefetched = p.recomputed, 0.0, 0.0
    if p.recompute == "offload" and p.recomputed:
        kept_inputs = 1  # the last block's: the backward needs it first
        host = (p.recomputed - 1) * t * width * r
        prefetched = t * width * r  # the next block's input, one layer ahead
    rows = _mlp_rows(s, p)
    mlp_grads = rows * 2 * s.d_ff * a  # two d_ff-wide gradients of the rows in hand at once
    if p.tile_tokens:  # a tile's recomputed intermediates, and the weights' fp32 gradients
        mlp_grads += rows * (width + s.mlp_widths * s.d_ff) * a + 4.0 * 3 * width * s.d_ff
    in_backward = block if p.recomputed else 0.0  # a recomputed block's tensors come back
    # the MLP's backward: the block's tensors, the residual gradient in and out, the MLP's
    mlp_moment = in_backward + 2 * t * width * r + mlp_grads
    # the attention's: the MLP half is gone; the residual gradient, dout, dq, dk, dv, the op's
    attention_moment = (
        in_backward - (_mlp_half(s, p) if p.recomputed else 0.0)
        + t * width * r + _attention_backward(s, p)
    )  # fmt: skip
    loss_moment = t * width * (r + a) + 2 * 4.0 * min(s.loss_chunk, t) * s.vocab
    moments = {
        "backward of a block's MLP": mlp_moment + prefetched,
        "backward of a block's attention": attention_moment + prefetched,
        "loss": loss_moment,
    }
    peak = max(moments, key=moments.get)
    terms = {
        "saved blocks": (s.n_layer - p.recomputed) * block,
        "block inputs": kept_inputs * t * width * r,
        peak: moments[peak],
    }
    return ActivationMemory(terms=terms, host=host)


def layer_shapes(model) -> LayerShapes:
    """The widths of `model` (built on the meta device is enough)."""
    cfg = model.config
    return LayerShapes(
        n_layer=cfg.n_layer, d_model=cfg.d_model, d_ff=cfg.d_ff,
        kv_dim=getattr(cfg, "kv_dim", cfg.d_model), n_head=cfg.n_head,
        mlp_widths=model.mlp_widths, vocab=getattr(cfg, "padded_vocab_size", cfg.vocab_size),
        loss_chunk=getattr(cfg, "loss_chunk_size", 0) or 0,
    )  # fmt: skip
