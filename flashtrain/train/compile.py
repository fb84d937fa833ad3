"""torch.compile of the model's blocks, as the trainer runs it (trainer.compile, trainer.cuda_graphs).

Each block compiles at its first call, with no graph break, and not again when the batches'
documents or padding change: what changes from batch to batch is traced symbolic from the first
call, so dynamo guards on no value of it. By default dynamo would specialize on the first
batch's values and recompile at the next ones (then trace them symbolic: its automatic dynamic).

    document masking    cu_seqlens (num_docs + 1,): its length, marked by the model
                        (TransformerModel.document_fields)
    flash on padding    the packed hidden states (N, C): N, marked by the model
                        (FlashAttention.padded_context)
    both                max_seqlen, a host int: named in VARYING_INTS below (an int cannot be
                        marked the way a tensor's dim is)

max_seqlen stays exact (the kernels size their grid from it): an upper bound such as seq_len
would launch programs that find no rows (and size the one-loop kernels' cleaned-value copy),
and bucketing it would still recompile once per bucket. What remains: evaluation (no gradients)
compiles its own graph, and a sliding window adds one when the longest document first crosses
it (a window the longest document fits in folds to unbounded: attention/reference.py fold_window).

trainer.cuda_graphs: mode="reduce-overhead" (CUDA graph trees: each compiled graph is captured
and replayed). A capture holds for one set of shapes and addresses, so check_cuda_graphs refuses
at start the runs where they change per step or where graph trees are known to fail.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtrain.data.registry import DATA
from flashtrain.train.config import ConfigError, TrainConfig, masks_documents
from flashtrain.train.distributed import is_sharded

# Ints the blocks read that change per batch, as dynamo names them in Block.forward(x, ctx)
# (and LlamaBlock's): torch.compiler.config.dynamic_sources makes them symbolic from the first
# trace (tests/train/test_compile_graphs.py fails if a rename leaves them unnamed).
VARYING_INTS = ("L['ctx'].max_seqlen",)


def compile_blocks(model: torch.nn.Module, trainer_cfg: Any, *, backend: Any = "inductor") -> None:
    """Compile each transformer block in place (the embedding, the head and the loss stay eager),
    with CUDA graphs when trainer_cfg.cuda_graphs (check_cuda_graphs has passed). backend: the
    trainer's is inductor; tests pass a cheaper one through the same path."""
    declare_varying_ints()
    options = {"mode": "reduce-overhead"} if trainer_cfg.cuda_graphs else {}
    for block in model.blocks:
        block.compile(backend=backend, **options)


def declare_varying_ints() -> None:
    """Add VARYING_INTS to torch.compiler.config.dynamic_sources (process-wide; they name only
    the blocks' own arguments), keeping the entries already there."""
    config = torch.compiler.config
    if not hasattr(config, "dynamic_sources"):  # torch < 2.7: one recompile, then automatic dynamic
        return
    entries = [s for s in config.dynamic_sources.replace(" ", "").split(",") if s]
    config.dynamic_sources = ",".join(dict.fromkeys([*entries, *VARYING_INTS]))


def check_cuda_graphs(
    cfg: TrainConfig, device: torch.device, *, grad_accum: int | None = None
) -> None:
    """Refuse trainer.cuda_graphs=true, with the reason, where CUDA graph trees cannot work in
    this trainer. grad_accum: micro-batches per optimizer step once the batch plan is final
    (micro_batch_size=auto is sized after the model is built); None: not known yet."""
    if not cfg.trainer.cuda_graphs:
        return
    reason = _cuda_graphs_refusal(cfg, device) or _accumulation_refusal(grad_accum)
    if reason:
        raise ConfigError(f"trainer.cuda_graphs=true {reason}; or set trainer.cuda_graphs=false")


def _accumulation_refusal(grad_accum: int | None) -> str | None:
    if grad_accum is None or grad_accum <= 1:
        return None
    return (
        f"cannot accumulate gradients over {grad_accum} micro-batches: the first micro-batch's "
        "gradients live in the graphs' memory, which the next micro-batch's replay overwrites "
        "(pytorch/pytorch#169545); set micro_batch_size to a rank's whole share of "
        "global_batch_size, if the GPU fits it"
    )


def _cuda_graphs_refusal(cfg: TrainConfig, device: torch.device) -> str | None:
    """Why CUDA graphs cannot run this config, or None."""
    t, data = cfg.trainer, cfg.data
    if device.type != "cuda":
        return f"needs a CUDA device (CUDA graphs are a CUDA feature); this run is on {device}"
    if t.compile is False:
        return (
            "needs trainer.compile=true: the graphs are those torch.compile captures "
            "(mode=reduce-overhead), and trainer.compile=false compiles nothing"
        )
    if masks_documents(data):
        return (
            "cannot run data.document_masking=true: the number of documents and the longest "
            "change every batch, and each new shape would record another graph; set "
            "data.document_masking=false to attend across documents"
        )
    if cfg.attention.impl == "flash" and DATA.build_class(data).for_config(data).pads_sequences:
        return (
            f"cannot run attention=flash on data '{data.name}', which pads its sequences: flash "
            "packs each batch's real tokens, a count that changes every batch (a graph each); "
            "use attention=sdpa, which keeps the padded (B, T) shape"
        )
    if cfg.model.recompute != "none":
        return (
            f"cannot run model.recompute={cfg.model.recompute}: graph trees fail on compiled "
            "blocks inside torch.utils.checkpoint (the recomputation frees a graph's inputs "
            "that the recording saw alive; pytorch/pytorch#154306); use model.recompute=none"
        )
    if is_sharded(t.strategy):
        return (
            f"cannot run trainer.strategy={t.strategy}: FSDP2 gathers each block's parameters into "
            "storage it frees and allocates again every step, and a graph replays the addresses "
            "it recorded; use trainer.strategy=ddp or single"
        )
    return None
