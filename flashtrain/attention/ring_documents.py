"""Document masking for ring attention: each ring step's varlen calls, planned on the host.

A document table is the cu_seqlens flash_attn_varlen_func takes for the full sequence: prefix
sums over its flattened (B * S_global) tokens. A token attends only to tokens of its own document
(and, causal, only to those at or before it); documents never join two rows of the batch.

A rank's shard of a row is its chunks in increasing position order, so along the shard the
documents come in increasing order too: one document's tokens in it form one run (a rank holds
at most two chunks, adjacent in the shard). A step's call therefore pairs, per document, the
run of query tokens it selects with the run of key tokens it selects, and covers the whole
flattened shards (B * S_local tokens on either side): tokens a call does not select become
padding sequences with no keys (for queries) or no queries (for keys), which see nothing, leave
the merged result untouched and get zero gradient. Per step (the K/V of rank `src` in hand):
- causal, our own K/V: each of our chunks against itself, causal per document (the diagonal);
- every pair of chunks whose queries see all keys (without causal: all pairs; causal: a key
  chunk before the query chunk): one non-causal call, shared by query chunks that see the same
  key chunks (the zigzag schedule's half-shard rectangles).
A call in which no query meets a key of its document is left out.
"""

from __future__ import annotations

import bisect
import functools
import numbers
from dataclasses import dataclass

import torch

from flashtrain.attention.ring_sharding import chunks_per_rank, rank_chunks

# (document index in its row, or None for tokens the call does not select; run length)
_Run = tuple[int | None, int]


@dataclass(frozen=True)
class VarlenCall:
    """One varlen attention call over the flattened local queries and K/V block in hand, each
    B * S_local tokens: prefix sums cu_q and cu_k (as many entries each) and the longest
    sequence on either side."""

    causal: bool
    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    max_q: int
    max_k: int


@dataclass(frozen=True, eq=False)
class DocumentPlan:
    """Every ring step's calls, and all their tables in one int32 CPU tensor (each call's cu_q
    then cu_k, in order), so that a ring call copies them to its device in one go."""

    steps: tuple[tuple[VarlenCall, ...], ...]  # per step s: the K/V of rank (rank - s) % P
    host_tables: torch.Tensor

    def device_tables(self, device: torch.device) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """(cu_q, cu_k) int32 on `device` per call of each step: views of one copy (pinned and
        asynchronous to a GPU: no host sync)."""
        host = self.host_tables
        if device.type == "cuda":
            host = host.pin_memory()
        table = host.to(device, non_blocking=True)
        tables, offset = [], 0
        for calls in self.steps:
            tables.append([])
            for call in calls:
                n_q, n_k = len(call.cu_q), len(call.cu_k)
                cu_q = table[offset : offset + n_q]
                cu_k = table[offset + n_q : offset + n_q + n_k]
                tables[-1].append((cu_q, cu_k))
                offset += n_q + n_k
        return tables


def document_table(cu_seqlens, batch: int, seq_len: int) -> tuple[int, ...]:
    """The checked document table as a tuple of ints.

    cu_seqlens: a sequence of ints or a CPU integer tensor (read once with .tolist()) of prefix
    sums over batch * seq_len tokens (seq_len: the full, global sequence length). Raises
    ValueError for a tensor off the CPU (the plan is made on the host; reading a GPU tensor
    would cost a device sync per call) and for a table that is not valid.
    """
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError(
                f"cu_seqlens is a tensor on {cu_seqlens.device}: ring attention plans its steps "
                "on the host, so pass the document table as a tuple of ints or a CPU tensor"
            )
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
            raise ValueError(
                f"cu_seqlens must be a 1-D integer tensor, got {cu_seqlens.dtype} "
                f"{tuple(cu_seqlens.shape)}"
            )
        cu_seqlens = tuple(cu_seqlens.tolist())
    elif isinstance(cu_seqlens, list):
        cu_seqlens = tuple(cu_seqlens)
    elif not isinstance(cu_seqlens, tuple):
        raise ValueError(
            "cu_seqlens must be a tuple (or list) of ints or a CPU integer tensor, "
            f"got {type(cu_seqlens).__name__}"
        )
    # Plain ints pass a C-speed test; anything else is checked and converted here, so that the
    # cache below never sees 8.0 or True (equal to 8 and 1 as keys).
    if not set(map(type, cu_seqlens)) <= {int}:
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in cu_seqlens):
            raise ValueError(f"cu_seqlens must hold ints, got {_shown(cu_seqlens)}")
        cu_seqlens = tuple(int(x) for x in cu_seqlens)
    return _checked_table(cu_seqlens, batch, seq_len)


@functools.lru_cache(maxsize=64)  # the model passes the same table to every layer
def _checked_table(table: tuple[int, ...], batch: int, seq_len: int) -> tuple[int, ...]:
    total = batch * seq_len
    if len(table) < 2 or table[0] != 0 or table[-1] != total:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at B * S_global = {batch} * {seq_len} = {total} "
            f"(the flattened full sequence), got {_shown(table)}"
        )
    for i in range(len(table) - 1):
        if table[i + 1] < table[i]:
            raise ValueError(
                f"cu_seqlens must be non-decreasing, but entry {i + 1} ({table[i + 1]}) is "
                f"below entry {i} ({table[i]})"
            )
    missing = sorted(set(range(seq_len, total, seq_len)) - set(table))
    if missing:
        raise ValueError(
            f"cu_seqlens has no boundary at {missing[0]}, the start of row "
            f"{missing[0] // seq_len}: a document may not join two rows of the batch, so every "
            f"multiple of S_global = {seq_len} must be an entry"
        )
    return table


def _shown(table: tuple) -> str:
    return repr(table) if len(table) <= 12 else f"({table[0]}, ..., {table[-1]}) of {len(table)}"


@functools.lru_cache(maxsize=256)  # once per (table, place in the ring): every layer reuses it
def plan_steps(
    table: tuple[int, ...], rank: int, size: int, layout: str, causal: bool, local_len: int,
    batch: int,
) -> DocumentPlan:  # fmt: skip
    """The calls of each ring step of `rank` in a group of `size`, shards of local_len tokens.

    table: a document table checked by document_table for (batch, local_len * size)."""
    seq_len = local_len * size
    rows = [_row_bounds(table, b * seq_len, seq_len) for b in range(batch)]
    chunk_len = local_len // chunks_per_rank(layout)
    mine = rank_chunks(layout, rank, size)
    steps = []
    for step in range(size):
        theirs = rank_chunks(layout, (rank - step) % size, size)
        calls = []
        if causal and mine == theirs:
            calls.append(_diagonal_call(rows, chunk_len, mine))
        sees_all = {}  # the key slots a query slot sees wholly -> those query slots
        for i, query_chunk in enumerate(mine):
            key_slots = tuple(
                j for j, key_chunk in enumerate(theirs) if not causal or key_chunk < query_chunk
            )
            if key_slots:
                sees_all.setdefault(key_slots, []).append(i)
        for key_slots, query_slots in sees_all.items():
            calls.append(_full_call(rows, chunk_len, mine, theirs, query_slots, key_slots))
        steps.append(tuple(call for call in calls if call is not None))
    flat = [x for calls in steps for call in calls for x in (*call.cu_q, *call.cu_k)]
    return DocumentPlan(tuple(steps), torch.tensor(flat, dtype=torch.int32))


def _row_bounds(table: tuple[int, ...], start: int, seq_len: int) -> list[int]:
    """The document boundaries of the row starting at `start`, relative to it: 0, ..., seq_len,
    strictly increasing (zero-length documents dropped)."""
    lo, hi = bisect.bisect_left(table, start), bisect.bisect_right(table, start + seq_len)
    return sorted({x - start for x in table[lo:hi]})


def _documents_in(bounds: list[int], start: int, stop: int) -> list[_Run]:
    """(document, token count) of each document meeting the positions [start, stop) of a row."""
    runs = []
    doc = bisect.bisect_right(bounds, start) - 1
    while doc < len(bounds) - 1 and bounds[doc] < stop:
        runs.append((doc, min(bounds[doc + 1], stop) - max(bounds[doc], start)))
        doc += 1
    return runs


def _shard_runs(bounds, chunk_len: int, chunks, selected) -> list[_Run]:
    """The runs along one row of a shard (its chunks in order): each selected chunk's documents,
    the other chunks as unselected runs (document None); equal neighbours joined."""
    runs: list[_Run] = []
    for slot, chunk in enumerate(chunks):
        start = chunk * chunk_len
        if slot in selected:
            pieces = _documents_in(bounds, start, start + chunk_len)
        else:
            pieces = [(None, chunk_len)]
        for doc, length in pieces:
            if runs and runs[-1][0] == doc:
                runs[-1] = (doc, runs[-1][1] + length)
            else:
                runs.append((doc, length))
    return runs


def _pair_runs(query_runs: list[_Run], key_runs: list[_Run]) -> list[tuple[int, int]]:
    """Sequences (query count, key count) walking both lists in order: a document's query run
    with its key run; a run without a partner (unselected, or a document the other side lacks)
    alone, with 0 tokens on the other side. Both lists list documents in increasing order."""
    sequences = []
    i = j = 0
    while i < len(query_runs) and j < len(key_runs):
        (q_doc, q_len), (k_doc, k_len) = query_runs[i], key_runs[j]
        if q_doc is not None and q_doc == k_doc:
            sequences.append((q_len, k_len))
            i, j = i + 1, j + 1
        elif q_doc is None or (k_doc is not None and q_doc < k_doc):
            sequences.append((q_len, 0))
            i += 1
        else:
            sequences.append((0, k_len))
            j += 1
    sequences += [(n, 0) for _, n in query_runs[i:]] + [(0, n) for _, n in key_runs[j:]]
    return sequences


def _full_call(rows, chunk_len, mine, theirs, query_slots, key_slots) -> VarlenCall | None:
    """Non-causal: the selected query chunks against the selected key chunks, per document."""
    sequences = []
    for bounds in rows:
        query_runs = _shard_runs(bounds, chunk_len, mine, query_slots)
        key_runs = _shard_runs(bounds, chunk_len, theirs, key_slots)
        sequences += _pair_runs(query_runs, key_runs)
    return _call(sequences, causal=False)


def _diagonal_call(rows, chunk_len, chunks) -> VarlenCall | None:
    """Causal: each chunk against itself, per document (every chunk selected on both sides)."""
    sequences = []
    for bounds in rows:
        for chunk in chunks:
            start = chunk * chunk_len
            sequences += [(n, n) for _, n in _documents_in(bounds, start, start + chunk_len)]
    return _call(sequences, causal=True)


def _call(sequences: list[tuple[int, int]], causal: bool) -> VarlenCall | None:
    """The call of these sequences, neighbours that attend to nothing joined (fewer sequences
    for the kernels' grid); None if no query meets a key."""
    joined: list[tuple[int, int]] = []
    for n_q, n_k in sequences:
        if n_q == 0 and n_k == 0:
            continue
        if joined and ((n_k == 0 and joined[-1][1] == 0) or (n_q == 0 and joined[-1][0] == 0)):
            joined[-1] = (joined[-1][0] + n_q, joined[-1][1] + n_k)
        else:
            joined.append((n_q, n_k))
    if not any(n_q and n_k for n_q, n_k in joined):
        return None
    cu_q, cu_k = [0], [0]
    for n_q, n_k in joined:
        cu_q.append(cu_q[-1] + n_q)
        cu_k.append(cu_k[-1] + n_k)
    return VarlenCall(
        causal=causal,
        cu_q=tuple(cu_q),
        cu_k=tuple(cu_k),
        max_q=max(n_q for n_q, _ in joined),
        max_k=max(n_k for _, n_k in joined),
    )
