"""Evaluating a checkpoint at chosen context lengths: perplexity (bits per byte on byte-level
data) and the loss by token position, the curve that shows whether a model uses far context.

Windows come from the data config's validation split, exactly as the trainer evaluates
(DataModule.val_batches: non-overlapping seq_len windows; synthetic recall generated from
the seed), or, with a stride S < seq_len on a token corpus, from sliding windows S tokens apart
that score only their last S tokens, and a last window ending at the split's end that scores the
tokens after its predecessor (every token but the first scored exactly once, each with at least
seq_len - S tokens of context). Every window is scored as the model was trained: under document
masking (data.document_masking) with the packed document tables of the trainer's batches, so a
token attends only inside its document and positions restart at each document's start, and a
document that fits in seq_len - S + 1 tokens is scored as if it were alone. A length beyond what
the model was trained at uses its positions as configured: GPT-2's learned table interpolated
(or copied) to the new length (model.init_positions), rotary positions as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from flashtrain.data.config import SyntheticConfig
from flashtrain.data.lm import TokenCacheLM
from flashtrain.data.lm_batches import lm_batch
from flashtrain.data.registry import build_data, data_config
from flashtrain.inference.memory import available_bytes, gib, largest
from flashtrain.models.decoder import position_limit, require_decoder

IGNORE_INDEX = -100
DOCUMENT_FIELDS = ("cu_seqlens", "max_seqlen", "position_ids")
LOGIT_CHUNK = 1024  # positions whose logits exist at a time (token_losses)


@dataclass
class LengthResult:
    """One context length's numbers (nats per scored token)."""

    seq_len: int
    tokens: int  # scored tokens
    loss: float
    position_loss: list[float | None]  # per bucket, None where nothing was scored
    position_tokens: list[int]
    bucket_edges: list[int]  # bucket i covers positions [edges[i], edges[i + 1])
    windows: str = "non-overlapping"  # or "sliding, stride S"
    text_loss: float | None = None  # the loss on targets that are not special ids (e.g. <eos>)
    text_tokens: int | None = None
    optimal_loss: float | None = None  # synthetic recall: the best any model can do
    position_optimal: list[float | None] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    def bits_per_byte(self) -> float:
        """Bits per byte of text (byte-level data): the loss on byte targets only, a document's
        <eos> being no byte of the text; the whole loss when no special id was given."""
        return (self.loss if self.text_loss is None else self.text_loss) / math.log(2)


def bucket_edges(seq_len: int, buckets: int) -> list[int]:
    """Log-spaced position buckets over [0, seq_len): fine near the start, coarse far out."""
    edges = np.unique(np.round(np.geomspace(1, seq_len, buckets)).astype(int))
    return [0, *[int(e) for e in edges if 0 < e < seq_len], seq_len]


def _bucketed(values: np.ndarray, counts: np.ndarray, edges: list[int]):
    sums = [float(values[a:b].sum()) for a, b in zip(edges, edges[1:])]
    tokens = [int(counts[a:b].sum()) for a, b in zip(edges, edges[1:])]
    return [s / n if n else None for s, n in zip(sums, tokens)], tokens


@torch.no_grad()
def token_losses(model, batch: dict, chunk: int = LOGIT_CHUNK) -> torch.Tensor:
    """Per-token loss (B, T) float32 in nats, 0 where labels are IGNORE_INDEX, from the model's
    own head (model.head_logits: a final softcap included); the logits exist `chunk` positions
    at a time."""
    device = model.output_weight().device
    ids, labels = batch["input_ids"].to(device), batch["labels"].to(device)
    extra = {k: batch[k].to(device) if torch.is_tensor(batch[k]) else batch[k]
             for k in DOCUMENT_FIELDS if k in batch}  # fmt: skip
    hidden = model.hidden_states(ids, **extra)  # (B, T, C)
    out = torch.zeros(labels.shape, dtype=torch.float32, device=device)
    for start in range(0, ids.shape[1], chunk):
        logits = model.head_logits(hidden[:, start : start + chunk]).float()  # (B, c, V)
        target = labels[:, start : start + chunk]
        loss = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE_INDEX,
                               reduction="none")  # fmt: skip
        out[:, start : start + chunk] = loss
    return out


def forward_bytes(model, seq_len: int, batch_size: int) -> int:
    """About the peak bytes of scoring one batch of seq_len windows with `model` (float32, no
    autograd): per token the hidden states kept, one block's working set (its input, q, k, v,
    the attention output, three d_ff-wide MLP tensors: SwiGLU's most), the ids, labels and
    loss; the logits and their log-softmax LOGIT_CHUNK positions at a time; a learned position
    table resized to seq_len (read and written, on load). An estimate, meant to refuse what
    cannot fit, not to promise what can."""
    cfg = model.config
    kv_dim = (getattr(cfg, "n_kv_head", None) or cfg.n_head) * cfg.head_dim
    per_token = 4 * (4 * cfg.d_model + 2 * kv_dim + 3 * cfg.d_ff) + 8 + 8 + 4
    logits = 2 * 4 * batch_size * min(seq_len, LOGIT_CHUNK) * cfg.vocab_size
    table = 2 * 4 * seq_len * cfg.d_model if position_limit(model) is not None else 0
    return batch_size * seq_len * per_token + logits + table


def check_evaluation_fits(model, seq_len: int, batch_size: int, device) -> None:
    """Refuse a length whose batches cannot fit the device's free memory, with the figure and
    the longest length that fits (before a position table of that length is built)."""
    free = available_bytes(device)
    need = forward_bytes(model, seq_len, batch_size)
    if free is None or need <= free:
        return
    fits = largest(lambda n: forward_bytes(model, n, batch_size) <= free, 2, seq_len)
    most = f"at most {fits} fits" if fits else "not even 2 fits"
    raise ValueError(
        f"--seq-len {seq_len} needs about {gib(need)} for a batch of {batch_size} windows but "
        f"{device} has {gib(free)} available: {most} at --batch-size {batch_size} (a smaller "
        "--batch-size fits longer windows)"
    )


def window_starts(length: int, seq_len: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored label) of each sliding window of seq_len + 1 tokens over `length`
    tokens: windows `stride` apart from 0, then one ending at the last token if they do not; a
    window scores the labels after the previous window's end, so every token but the first is
    scored exactly once."""
    if stride < 1:
        raise ValueError(f"the stride must be >= 1 (tokens between windows), got {stride}")
    if length < seq_len + 1:
        raise ValueError(f"the split has {length} tokens: fewer than one window of {seq_len + 1}")
    starts = list(range(0, length - seq_len, stride))
    if starts[-1] + seq_len < length - 1:  # the tail after the last full stride
        starts.append(length - 1 - seq_len)
    firsts = [0] + [prev + seq_len - s for prev, s in zip(starts, starts[1:])]
    return list(zip(starts, firsts))


def sliding_windows(tokens, seq_len: int, stride: int, batch_size: int, max_batches: int | None,
                    eos_id: int | None = None):  # fmt: skip
    """Batches of the windows of window_starts, the labels before each window's first scored
    one IGNORE_INDEX: each token is scored once, with at least seq_len - stride tokens before it.
    eos_id (a run trained with document masking): each window carries the packed document
    tables the trainer's batches carry (lm_batch), so its tokens attend only inside their
    document and positions restart at each document's start, as in training."""
    starts = window_starts(len(tokens), seq_len, stride)
    if max_batches is not None:
        starts = starts[: max_batches * batch_size]
    for at in range(0, len(starts), batch_size):
        chunk = starts[at : at + batch_size]
        rows = np.stack([np.asarray(tokens[s : s + seq_len + 1]) for s, _ in chunk])
        batch = lm_batch(rows, eos_id)
        # a one-row batch's labels are a view of its input_ids (.contiguous() of a (1, T) slice
        # returns it as is): mask a copy
        batch["labels"] = batch["labels"].clone()
        for row, (_, first) in enumerate(chunk):
            batch["labels"][row, :first] = IGNORE_INDEX
        yield batch


def windows(data_cfg, seq_len: int, *, stride: int | None, batch_size: int,
            max_batches: int | None, seed: int) -> tuple[Iterable[dict], int | None, str]:  # fmt: skip
    """(batches, how many, what windows) of one context length's evaluation windows."""
    cfg = data_config(data_cfg)
    if isinstance(cfg, SyntheticConfig) and max_batches is None:
        max_batches = 8  # generated data has no natural size
    data = build_data(cfg, seq_len=seq_len, micro_batch_size=batch_size, seed=seed,
                      eval_batches=max_batches)  # fmt: skip
    if data.task != "lm":
        raise ValueError(
            f"data {cfg.name!r} is a {data.task} task; evaluate takes language-model data"
        )
    if stride is None or stride >= seq_len:
        batches = data.val_batches()
        return batches, len(batches), "non-overlapping"
    if not isinstance(data, TokenCacheLM):
        raise ValueError(
            f"--stride needs a token corpus (data loader lm_corpus without streaming); {cfg.name!r} "
            "has no token array to slide over: drop --stride for non-overlapping windows"
        )
    tokens = data.splits["validation"].tokens
    count = -(-len(window_starts(len(tokens), seq_len, stride)) // batch_size)
    if max_batches is not None:
        count = min(count, max_batches)
    batches = sliding_windows(tokens, seq_len, stride, batch_size, max_batches, data.masking_eos_id)
    return batches, count, f"sliding, stride {stride}"


def recall_position_optimum(cfg: SyntheticConfig, seq_len: int) -> np.ndarray | None:
    """The best expected loss at each label position of synthetic recall (values only):
    log(num_values) times the chance that the value's key is new, at label position 2j."""
    if cfg.loss_on != "values":
        return None
    positions = np.arange(seq_len)
    unseen = (1.0 - 1.0 / cfg.num_keys) ** (positions // 2)
    return np.where(positions % 2 == 0, math.log(cfg.num_values) * unseen, np.nan)


def evaluate_length(model, data_cfg, seq_len: int, *, stride: int | None = None,
                    batch_size: int = 8, max_batches: int | None = None, seed: int = 1234,
                    buckets: int = 16, progress=None, special_ids=()) -> LengthResult:  # fmt: skip
    """The loss of `model` on seq_len windows of data_cfg (see the module docstring).
    special_ids: token ids that are not text (a byte tokenizer's <eos>): with any, the result
    also has the loss on the other targets (text_loss, what bits per byte counts)."""
    require_decoder(model)
    limit = position_limit(model)
    if limit is not None and seq_len > limit:
        raise ValueError(f"seq_len {seq_len} exceeds the model's {limit} positions")
    if seq_len < 2 or batch_size < 1 or (stride is not None and stride < 1):
        raise ValueError(
            f"seq_len must be >= 2, batch_size >= 1 and stride None or >= 1, got {seq_len}, "
            f"{batch_size}, {stride}"
        )
    check_evaluation_fits(model, seq_len, batch_size, model.output_weight().device)
    batches, count, kind = windows(data_cfg, seq_len, stride=stride, batch_size=batch_size,
                                   max_batches=max_batches, seed=seed)  # fmt: skip
    sums = np.zeros(seq_len)
    counts = np.zeros(seq_len, dtype=np.int64)
    text_sum, text_count = 0.0, 0
    specials = torch.tensor(sorted(special_ids), dtype=torch.long)
    bar = progress(total=count, desc=f"seq_len {seq_len}") if progress else None
    for batch in batches:
        losses = token_losses(model, batch)  # (B, T)
        labels = batch["labels"].to(losses.device)
        scored = labels != IGNORE_INDEX
        sums += losses.sum(0).double().cpu().numpy()
        counts += scored.sum(0).cpu().numpy()
        if len(specials):
            text = scored & ~torch.isin(labels, specials.to(labels.device))
            text_sum += float(losses[text].double().sum())
            text_count += int(text.sum())
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    total = int(counts.sum())
    if total == 0:
        raise ValueError(f"no token was scored at seq_len {seq_len}: the split is too small")
    edges = bucket_edges(seq_len, buckets)
    position_loss, position_tokens = _bucketed(sums, counts, edges)
    result = LengthResult(seq_len, total, float(sums.sum() / total), position_loss,
                          position_tokens, edges, windows=kind)  # fmt: skip
    if len(specials) and text_count:
        result.text_loss, result.text_tokens = text_sum / text_count, text_count
    cfg = data_config(data_cfg)
    if isinstance(cfg, SyntheticConfig):
        optimum = recall_position_optimum(cfg, seq_len)
        if optimum is not None:
            weights = np.where(np.isnan(optimum), 0.0, counts)
            result.optimal_loss = float((np.nan_to_num(optimum) * weights).sum() / weights.sum())
            result.position_optimal, _ = _bucketed(np.nan_to_num(optimum) * weights, weights, edges)
    return result
