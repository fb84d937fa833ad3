"""Evaluation: the loss (and perplexity for LM / MLM, accuracy for MLM / classification) over a
data module's validation batches, summed over every rank; and the check, at start, that there
are validation batches to evaluate."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from flashtrain.collectives import all_reduce_sum
from flashtrain.train.distributed import DistEnv
from flashtrain.train.faults import EvaluationAbandoned
from flashtrain.train.metric_names import EVAL_ACCURACY, EVAL_LOSS, EVAL_PPL
from flashtrain.train.prefetch import to_device
from flashtrain.typed_config import ConfigError


def check_validation_data(data: Any, trainer_cfg: Any, data_name: str) -> None:
    """Validation data too small for one batch is a ConfigError at start, not an error after
    the last step (val_batches checks its size when called; batches are made when iterated).
    Nothing is checked for a run that never evaluates."""
    if not (trainer_cfg.eval_interval or trainer_cfg.eval_at_end):
        return
    try:
        data.val_batches()
    except ValueError as e:
        raise ConfigError(
            f"data '{data_name}': {e}; give it more validation data, or evaluate never "
            f"(trainer.eval_interval=0 trainer.eval_at_end=false)"
        ) from e


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    data: Any,
    env: DistEnv,
    *,
    sharded: bool,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    stop_requested: Callable[[], bool] = lambda: False,
) -> dict[str, float]:
    """eval/loss (target-weighted over all ranks), eval/ppl, eval/accuracy; {} without data.
    sharded (FSDP2): every rank runs as many forward passes as the rank with the most batches.
    stop_requested(): whether this rank was asked to stop (SIGTERM); asked before each batch,
    and when any rank was, every rank raises EvaluationAbandoned there."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss*n, n, correct
    has_correct = False
    it = iter(data.val_batches())  # at most trainer.eval_batches per rank
    last_batch = None
    done = 0
    while True:
        batch = next(it, None)
        votes = [float(batch is not None), float(stop_requested())]  # has data, asked to stop
        if env.world_size > 1:  # every rank goes on, or stops, at the same batch
            votes = all_reduce_sum(torch.tensor(votes, device=env.device)).tolist()
        if votes[1] > 0:
            model.train()
            raise EvaluationAbandoned(done)
        if votes[0] == 0:
            break
        if batch is None:  # another rank still has data
            if not sharded:
                continue
            # FSDP forward passes are collectives: ranks that ran out repeat their last batch
            # at weight zero.
            if last_batch is None:
                raise RuntimeError(f"rank {env.rank} has no validation data for FSDP eval")
            batch, weight = last_batch, 0.0
        else:
            weight = 1.0
        last_batch = batch
        with autocast():
            out = model(**to_device(batch, env.device))
        n = out.num_targets.double() * weight
        if float(n) > 0:
            sums[0] += out.loss.double() * n
        sums[1] += n
        if out.correct is not None:
            has_correct = True
            sums[2] += out.correct.double() * weight
        done += 1
    all_reduce_sum(sums)
    model.train()
    total = float(sums[1])
    metrics: dict[str, float] = {}
    if total > 0:
        loss = float(sums[0]) / total
        metrics[EVAL_LOSS] = loss
        if data.task in ("lm", "mlm"):
            metrics[EVAL_PPL] = math.exp(min(loss, 50.0))
        if has_correct or data.task == "classification":
            metrics[EVAL_ACCURACY] = float(sums[2]) / total
    return metrics
