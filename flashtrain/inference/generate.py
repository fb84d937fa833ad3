"""Sampling from a decoder with a KV cache: several prompts of different lengths in one batch.

The prompts are right-padded into one (B, P) batch and prefilled in one causal pass of the
flash kernels (padding sits after each prompt, so no prompt token sees it); each sequence's
first new token comes from the logits at its own last prompt token. Then one token per
sequence per step: the model runs on (B, 1) tokens at positions seqlens[b], attention through
the KV cache (flashtrain.inference.kv_cache). A model qualifies when it has
`hidden_states(input_ids, position_ids=...)`, `head_logits(hidden)` (the LM head and whatever
follows it, e.g. a final softcap), `output_weight()` and attention layers that call
`attn_op(q, k, v, ctx, dropout_p)` (GPT-2; the Llama family). check_generation refuses, before
anything is allocated, what cannot work: an encoder, positions past a learned table, a KV
cache larger than the device's free memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashtrain.inference.kv_cache import KVCache, kv_cache_bytes
from flashtrain.inference.memory import available_bytes, gib, largest
from flashtrain.models.decoder import position_limit, require_decoder


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (argmax). top_k 0 and top_p 1.0: off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.temperature < math.inf:
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
            )
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None):
    """logits (B, V) -> tokens (B,) int64: greedy, or a draw after temperature, top-k, top-p."""
    if sampling.temperature == 0.0:
        return logits.argmax(dim=-1)
    # the max taken away before dividing: the top token's 0 stays 0 however small the temperature
    # (logits / 1e-40 overflow float32, and inf - inf in the softmax is nan); a temperature
    # below float32's smallest normal number gives the same draw as that number
    logits = logits.float()
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / max(
        sampling.temperature, torch.finfo(torch.float32).tiny
    )
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= sampling.top_p  # the top token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_generation(
    model, prompts: list[list[int]], max_new_tokens: int, *, option: str = "max_new_tokens"
) -> None:
    """Everything generate() needs, checked before anything is allocated or printed: prompts,
    positions (a learned table's length) and the KV cache's memory on the model's device.
    option: how the caller names max_new_tokens (the command line: --max-new-tokens)."""
    require_decoder(model)
    if not prompts:
        raise ValueError("generate needs at least one prompt, each of at least one token")
    empty = [i + 1 for i, p in enumerate(prompts) if len(p) == 0]
    if empty:  # an empty text under a tokenizer that adds no <bos> (bytes, GPT-2)
        raise ValueError(
            f"generate needs at least one token in each prompt, and prompt {empty[0]} has none "
            "(its text is empty and the tokenizer adds no <bos>): give it some text"
        )
    if max_new_tokens < 1:
        raise ValueError(f"{option} must be >= 1, got {max_new_tokens}")
    longest, batch = max(len(p) for p in prompts), len(prompts)
    limit = position_limit(model)
    if limit is not None and longest > limit:
        raise ValueError(
            f"the longest prompt ({longest} tokens) is longer than the model's {limit} learned "
            "positions (model.max_seq_len): shorten it"
        )
    if limit is not None and longest + max_new_tokens - 1 > limit:
        # the last new token is never fed back, so it needs no position
        raise ValueError(
            f"the longest prompt ({longest} tokens) + {option} ({max_new_tokens}) - 1 exceeds "
            f"the model's {limit} learned positions (model.max_seq_len): {option} at most "
            f"{limit - longest + 1}"
        )
    device = model.output_weight().device
    free = available_bytes(device)
    need = kv_cache_bytes(model, batch, longest + max_new_tokens)
    if free is not None and need > free:
        fits = largest(lambda n: kv_cache_bytes(model, batch, longest + n) <= free, 1,
                       max_new_tokens)  # fmt: skip
        most = f"{option} at most {fits}" if fits else "not one new token fits"
        raise ValueError(
            f"{option} {max_new_tokens}: the KV cache of {batch} sequence(s) of {longest} + "
            f"{max_new_tokens} positions needs {gib(need)} but {device} has {gib(free)} "
            f"available: {most}"
        )


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """hidden (B, C) -> (B, vocab) float32 logits: the model's own head (with any final softcap)."""
    return model.head_logits(hidden).float()


@torch.inference_mode()
def generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling = Sampling(temperature=0.0),
    *,
    seed: int | None = None,
    stop_id: int | None = None,
    on_step: Callable[[list[int | None]], None] | None = None,
) -> list[list[int]]:
    """New tokens for each prompt (token id lists, each non-empty): up to max_new_tokens, ending
    early at stop_id (included). on_step(tokens) is called after every step with the token each
    sequence produced (None for a finished one): streaming. seed makes sampling repeatable."""
    check_generation(model, prompts, max_new_tokens)
    device = model.output_weight().device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    longest, batch = int(lengths.max()), len(prompts)
    total = longest + max_new_tokens
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.zeros(batch, longest, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    model.eval()
    cache = KVCache(batch, total)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * batch
    with cache.attached(model):
        hidden = model.hidden_states(ids)  # (B, P, C): the prefill
        last = hidden[torch.arange(batch, device=device), lengths - 1]  # (B, C)
        cache.finish_prefill(lengths)
        for step in range(max_new_tokens):
            token = next_tokens(_logits(model, last), sampling, generator)  # (B,)
            values = token.tolist()
            streamed: list[int | None] = []
            for b, t in enumerate(values):
                streamed.append(None if done[b] else t)
                if not done[b]:
                    out[b].append(t)
                    done[b] = t == stop_id or len(out[b]) == max_new_tokens
            if on_step is not None:
                on_step(streamed)
            if all(done) or step == max_new_tokens - 1:
                break
            positions = cache.seqlens.long()[:, None]  # (B, 1)
            hidden = model.hidden_states(token[:, None], position_ids=positions)  # (B, 1, C)
            last = hidden[:, 0]
            cache.advance()
    return out
