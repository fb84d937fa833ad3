"""The names of the training metrics: one set, the same on the console, in metrics.jsonl, in wandb
and in TensorBoard.

`train/...` what the model did, `perf/...` how fast, `memory/...` how much, `eval/...` the
validation metrics (flashtrain/train/evaluation.py). Run folders written before these names
(plain `loss`, `lr`, `tokens_per_s`, ...) are read through `canonical_row`.
"""

from __future__ import annotations

TRAIN_LOSS = "train/loss"  # mean over the interval's optimizer updates (nats per target)
TRAIN_LR = "train/lr"  # the last update's learning rate
TRAIN_GRAD_NORM = "train/grad_norm"  # the last update's gradient norm (before clipping)
TRAIN_ACCURACY = "train/accuracy"  # over every target scored in the interval (MLM, classifier)
TRAIN_TOKENS_SEEN = "train/tokens_seen"
TRAIN_LOSS_SCALE = "train/loss_scale"  # fp16's gradient scaler
TOKENS_PER_S = "perf/tokens_per_s"  # all ranks together
TOKENS_PER_S_PER_DEVICE = "perf/tokens_per_s_per_device"
STEP_TIME_S = "perf/step_time_s"
MFU = "perf/mfu"  # percent of the device's peak FLOP/s
MAX_RESERVED_GIB = "memory/max_reserved_gib"  # CUDA's caching allocator, this rank
MAX_ALLOCATED_GIB = "memory/max_allocated_gib"
MAX_RSS_GIB = "memory/max_rss_gib"  # a CPU run: the process's peak resident set
EVAL_LOSS = "eval/loss"
EVAL_PPL = "eval/ppl"
EVAL_ACCURACY = "eval/accuracy"

# The names metrics.jsonl used before this module (run folders from 2026-11 and earlier).
OLD_NAMES = {
    "loss": TRAIN_LOSS,
    "lr": TRAIN_LR,
    "grad_norm": TRAIN_GRAD_NORM,
    "accuracy": TRAIN_ACCURACY,
    "tokens_seen": TRAIN_TOKENS_SEEN,
    "loss_scale": TRAIN_LOSS_SCALE,
    "tokens_per_s": TOKENS_PER_S,
    "tokens_per_s_per_device": TOKENS_PER_S_PER_DEVICE,
    "step_time_s": STEP_TIME_S,
    "mfu": MFU,
}


def canonical_row(row: dict) -> dict:
    """A metrics.jsonl row with today's names (an old run's `loss` becomes `train/loss`)."""
    return {OLD_NAMES.get(key, key): value for key, value in row.items()}
