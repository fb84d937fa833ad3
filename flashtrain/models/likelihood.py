"""How likely a decoder finds a continuation of a context: the log-probability of its tokens
and whether greedy decoding would produce them, in one teacher-forced pass (no generation).

The pairs are right-padded into (B, T) batches of context + continuation[:-1] (padding after a
sequence is never attended by its own tokens: causal) and ordered longest first, so that a
batch holds similar lengths; only the positions that predict a continuation token go through
the LM head, so a 64K-token context costs no (64K, vocab) logits. Used by the retrieval tasks'
likelihood score (flashtrain/tasks/scoring.py, the trainer's too) and the lm-evaluation-harness client
(flashtrain/inference/lm_eval_client.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flashtrain.models.decoder import position_limit, require_decoder


@dataclass(frozen=True)
class ContinuationScore:
    """logprob: sum over the continuation's tokens of log p(token | everything before it), in
    nats; greedy: every one of them is the most likely token there (ties: the lowest id, as
    argmax), i.e. greedy decoding from the context alone would produce the continuation."""

    logprob: float
    greedy: bool


def check_pairs(model, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]):
    """One context of >= 1 token and one continuation of >= 1 token per pair, within the
    model's learned positions (a rotary model has no table: any length runs)."""
    if len(contexts) != len(continuations):
        raise ValueError(
            f"{len(contexts)} contexts but {len(continuations)} continuations: give one of each "
            "per pair"
        )
    limit = position_limit(model)
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        if not context or not continuation:
            what = "context" if not context else "continuation"
            raise ValueError(
                f"pair {i}: its {what} has no tokens; a likelihood needs >= 1 token of each "
                "(start an empty context with the tokenizer's <bos> or <eos>)"
            )
        if limit is not None and len(context) + len(continuation) - 1 > limit:
            raise ValueError(
                f"pair {i}: {len(context)} context + {len(continuation)} continuation tokens "
                f"need {len(context) + len(continuation) - 1} positions, more than the model's "
                f"{limit} learned positions (model.max_seq_len): shorten the context"
            )


@torch.no_grad()  # not inference_mode: FSDP2's gathered weights are reused in training
def continuation_scores(
    model,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> list[ContinuationScore]:
    """One ContinuationScore per (context, continuation) pair, in the pairs' order, from
    batches of at most batch_size pairs; on_batch(pairs) after each batch (progress)."""
    require_decoder(model)
    check_pairs(model, contexts, continuations)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = model.output_weight().device
    order = sorted(range(len(contexts)), key=lambda i: -(len(contexts[i]) + len(continuations[i])))
    scores: list[ContinuationScore | None] = [None] * len(contexts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            inputs = [[*contexts[i], *continuations[i]][:-1] for i in rows]
            ids = torch.zeros(len(rows), max(map(len, inputs)), dtype=torch.long)
            for b, row in enumerate(inputs):
                ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            hidden = model.hidden_states(ids.to(device))  # (B, T, C)
            for b, i in enumerate(rows):
                first = len(contexts[i]) - 1  # the position that predicts continuation[0]
                target = torch.tensor(continuations[i], dtype=torch.long, device=device)  # (K,)
                logits = model.head_logits(hidden[b, first : first + len(target)]).float()
                logprobs = torch.log_softmax(logits, dim=-1)  # (K, vocab)
                picked = logprobs.gather(-1, target[:, None]).sum()
                greedy = bool((logits.argmax(dim=-1) == target).all())
                scores[i] = ContinuationScore(float(picked), greedy)
            if on_batch is not None:
                on_batch(len(rows))
    finally:
        model.train(was_training)
    return scores  # type: ignore[return-value]
