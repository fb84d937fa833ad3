"""How one sequence is split over the ranks of a context-parallel group, and back.

contiguous: P equal chunks, rank r holds chunk r (tokens [r*S/P, (r+1)*S/P)).
zigzag:     2P equal chunks, rank r holds chunks r and 2P-1-r, in that order, so that under a
            causal mask every rank has the same amount of past to attend to.

A rank's shard is its chunks concatenated in increasing position order; shard_positions gives
the global position of each of its tokens (for rotary or learned position embeddings).

Ulysses and hybrid context parallelism (flashtrain.attention.ulysses) cut each ring shard into
U contiguous pieces, one per rank of a Ulysses group: take_cp_shard, cp_shard_positions.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not supported; allowed: {', '.join(LAYOUTS)}")


def chunks_per_rank(layout: str) -> int:
    check_layout(layout)
    return 2 if layout == "zigzag" else 1


def rank_chunks(layout: str, rank: int, world_size: int) -> tuple[int, ...]:
    """Indices of the chunks (of world_size * chunks_per_rank) that `rank` holds, in order."""
    if chunks_per_rank(layout) == 1:
        return (rank,)
    return (rank, 2 * world_size - 1 - rank)


def group_rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(this process's rank in `group`, the group's size). group=None is the world, which is
    this process alone when torch.distributed is not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialized")
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    return rank, dist.get_world_size(group)


def check_sequence_length(seq_len: int, world_size: int, layout: str, what: str) -> None:
    """seq_len must split into world_size * chunks_per_rank equal chunks."""
    parts = world_size * chunks_per_rank(layout)
    if seq_len % parts != 0:
        rule = f"2*P = {parts}" if layout == "zigzag" else f"P = {parts}"
        raise ValueError(
            f"{what} is {seq_len}, which layout={layout!r} over P={world_size} ranks cannot "
            f"split evenly: it must be a multiple of {rule}"
        )


def _normalize_dim(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def take_shard(x: torch.Tensor, dim: int, rank: int, world_size: int, layout: str):
    """This rank's chunks of the full tensor x, concatenated along dim (a new tensor)."""
    chunk = x.shape[dim] // (world_size * chunks_per_rank(layout))
    parts = [x.narrow(dim, i * chunk, chunk) for i in rank_chunks(layout, rank, world_size)]
    return torch.cat(parts, dim)


def shard_positions(
    seq_len: int,
    rank: int,
    world_size: int,
    *,
    layout: str = "zigzag",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Global positions (int64, (seq_len / world_size,)) of the tokens `rank` holds, in its
    local order. No process group needed: data loaders call it with their own rank."""
    check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    check_sequence_length(seq_len, world_size, layout, "seq_len")
    positions = torch.arange(seq_len, device=device)
    return take_shard(positions, 0, rank, world_size, layout)


def _gather(x_local: torch.Tensor, group, dim: int, layout: str) -> torch.Tensor:
    """All-gather the shards and put every chunk back at its global place."""
    rank, world_size = group_rank_and_size(group)
    if world_size == 1:
        return x_local.clone()
    x_local = x_local.contiguous()
    shards = [torch.empty_like(x_local) for _ in range(world_size)]
    dist.all_gather(shards, x_local, group=group)
    per_rank = chunks_per_rank(layout)
    chunk = x_local.shape[dim] // per_rank
    owner = {}  # global chunk index -> (rank, slot in that rank's shard)
    for r in range(world_size):
        for slot, index in enumerate(rank_chunks(layout, r, world_size)):
            owner[index] = (r, slot)
    pieces = []
    for index in range(world_size * per_rank):
        r, slot = owner[index]
        pieces.append(shards[r].narrow(dim, slot * chunk, chunk))
    return torch.cat(pieces, dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int, layout: str) -> torch.Tensor:
    """This rank's shard of the sum over ranks of x (the adjoint of _gather)."""
    rank, world_size = group_rank_and_size(group)
    if world_size == 1:
        return take_shard(x, dim, 0, 1, layout)
    shards = [take_shard(x, dim, r, world_size, layout) for r in range(world_size)]
    out = torch.empty_like(shards[rank])
    dist.reduce_scatter(out, shards, group=group)
    return out


class _Shard(torch.autograd.Function):
    """Forward: take this rank's shard. Backward: gather, so every rank gets the gradient of
    the sum of all ranks' losses with respect to the (logically replicated) full tensor."""

    @staticmethod
    def forward(ctx, x, group, layout, dim):
        ctx.group, ctx.layout, ctx.dim = group, layout, dim
        rank, world_size = group_rank_and_size(group)
        return take_shard(x, dim, rank, world_size, layout)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.group, ctx.dim, ctx.layout), None, None, None


class _Unshard(torch.autograd.Function):
    """Forward: all-gather. Backward: reduce-scatter, each rank's shard of the summed gradient
    (every rank's loss depends on every shard through the gathered tensor)."""

    @staticmethod
    def forward(ctx, x_local, group, layout, dim):
        ctx.group, ctx.layout, ctx.dim = group, layout, dim
        return _gather(x_local, group, dim, layout)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad.contiguous(), ctx.group, ctx.dim, ctx.layout), None, None, None


def shard_sequence(
    x: torch.Tensor, group: dist.ProcessGroup | None = None, *, layout: str = "zigzag", dim: int = 1
) -> torch.Tensor:
    """This rank's shard of the full tensor x along dim (the sequence axis, default 1 as in
    (B, S, ...)). x.shape[dim] must be a multiple of P (contiguous) or 2P (zigzag).
    Differentiable: the backward all-gathers the shards' gradients."""
    dim = _normalize_dim(x, dim)
    check_layout(layout)
    _, world_size = group_rank_and_size(group)
    check_sequence_length(x.shape[dim], world_size, layout, f"the length of dim {dim}")
    return _Shard.apply(x, group, layout, dim)


def unshard_sequence(
    x_local: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    layout: str = "zigzag",
    dim: int = 1,
) -> torch.Tensor:
    """The full tensor from every rank's shard (an all-gather; every rank must pass the same
    shape). Differentiable: the backward reduce-scatters the gradient."""
    dim = _normalize_dim(x_local, dim)
    per_rank = chunks_per_rank(layout)
    if x_local.shape[dim] % per_rank != 0:
        raise ValueError(
            f"the shard's length along dim {dim} is {x_local.shape[dim]}; layout={layout!r} "
            f"holds {per_rank} equal chunks per rank, so it must be a multiple of {per_rank}"
        )
    group_rank_and_size(group)  # membership and initialization checks
    return _Unshard.apply(x_local, group, layout, dim)


# ---- Context parallelism in general: Ulysses groups of U ranks inside a ring of R groups. ----
#
# A context-parallel group of P = R * U ranks numbers its ranks p = r * U + u (r: ring index,
# u: index inside a Ulysses group of consecutive ranks). Rank p holds ring shard r of the
# sequence (take_shard over R ranks in `layout`) cut into U equal contiguous pieces: piece u.
# Ring attention alone is (R = P, U = 1), today's shard exactly; Ulysses alone is (R = 1, U = P),
# contiguous piece p of the whole sequence whatever the layout; hybrid is anything between.


def _check_cp_sizes(ring_size: int, ulysses_size: int) -> None:
    for name, size in (("ring_size", ring_size), ("ulysses_size", ulysses_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be an int >= 1, got {size!r}")


def check_cp_sequence_length(
    seq_len: int, ring_size: int, ulysses_size: int, layout: str, what: str
) -> None:
    """seq_len must split into R ring shards of U equal pieces: a multiple of
    R * U * chunks_per_rank(layout) when R > 1, of U when R == 1 (no ring, no layout)."""
    _check_cp_sizes(ring_size, ulysses_size)
    per_rank = chunks_per_rank(layout)  # checks the layout's name even when R == 1
    if ring_size == 1:
        parts, rule = ulysses_size, f"U = {ulysses_size}"
    else:
        parts = ring_size * ulysses_size * per_rank
        rule = f"R * U{' * 2' if per_rank == 2 else ''} = {parts}"
    if seq_len % parts != 0:
        raise ValueError(
            f"{what} is {seq_len}, which R={ring_size} ring shards (layout={layout!r}) of "
            f"U={ulysses_size} Ulysses pieces cannot split evenly: it must be a multiple of {rule}"
        )


def take_cp_shard(
    x: torch.Tensor, dim: int, rank: int, ring_size: int, ulysses_size: int, layout: str
) -> torch.Tensor:
    """Context-parallel rank `rank`'s tokens of the full tensor x along dim, in its local order
    (a new tensor): piece u = rank % U of ring shard r = rank // U (see above)."""
    dim = _normalize_dim(x, dim)
    check_cp_sequence_length(
        x.shape[dim], ring_size, ulysses_size, layout, f"the length of dim {dim}"
    )
    if not 0 <= rank < ring_size * ulysses_size:
        raise ValueError(
            f"rank={rank} must be in [0, R * U = {ring_size * ulysses_size}) "
            f"(R={ring_size}, U={ulysses_size})"
        )
    ring_rank, ulysses_rank = divmod(rank, ulysses_size)
    ring_shard = x if ring_size == 1 else take_shard(x, dim, ring_rank, ring_size, layout)
    piece = ring_shard.shape[dim] // ulysses_size
    return ring_shard.narrow(dim, ulysses_rank * piece, piece).clone()


def cp_shard_positions(
    seq_len: int,
    rank: int,
    ring_size: int,
    ulysses_size: int,
    *,
    layout: str = "zigzag",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Global positions (int64, (seq_len / (R * U),)) of the tokens context-parallel rank
    `rank` holds, in its local order (for rotary or learned position embeddings)."""
    positions = torch.arange(seq_len, device=device)
    return take_cp_shard(positions, 0, rank, ring_size, ulysses_size, layout)


def cp_unshard(
    shards: list[torch.Tensor], dim: int, ring_size: int, ulysses_size: int, layout: str
) -> torch.Tensor:
    """The full tensor from every rank's shard (shards[p] as take_cp_shard gives rank p's):
    the inverse of take_cp_shard, on one process (tests, debugging)."""
    _check_cp_sizes(ring_size, ulysses_size)
    if len(shards) != ring_size * ulysses_size:
        raise ValueError(
            f"got {len(shards)} shards; R={ring_size} x U={ulysses_size} ranks need "
            f"{ring_size * ulysses_size}"
        )
    dim = _normalize_dim(shards[0], dim)
    u = ulysses_size
    ring_shards = [torch.cat(shards[r * u : (r + 1) * u], dim) for r in range(ring_size)]
    if ring_size == 1:
        return ring_shards[0]
    per_rank = chunks_per_rank(layout)
    chunk = ring_shards[0].shape[dim] // per_rank
    pieces = [None] * (ring_size * per_rank)  # global chunk index -> its tokens
    for r, ring_shard in enumerate(ring_shards):
        for slot, index in enumerate(rank_chunks(layout, r, ring_size)):
            pieces[index] = ring_shard.narrow(dim, slot * chunk, chunk)
    return torch.cat(pieces, dim)
