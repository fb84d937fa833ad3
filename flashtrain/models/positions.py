"""Positions: explicit position ids, applying rotary tables (computed in rotary.py, the one RoPE
implementation GPT-2's position=rotary and Llama share), the 2-D (row + column) grid, the length check
of learned tables, and resizing learned tables so a checkpoint trained at a shorter context (or a
smaller image) loads into a longer one.

Models take optional `position_ids` (B, T): the global position of each token. Without them a
sequence is at positions 0..T-1; with context parallelism a rank holds a shard of each sequence
(zigzag: two chunks far apart) and the batch carries the shard's global positions.

Learned 1-D tables are plain nn.Embedding rows (GPT-2 `wpe`, BERT `position_embeddings`, the
classifier's `pos_emb`); 2-D tables are two nn.Embedding over an image side (`pos_row`, `pos_col`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashtrain.models.config import POSITION_RESIZE_MODES


def check_seq_len(seqlen: int, max_seq_len: int, what: str = "positional table") -> None:
    if seqlen > max_seq_len:
        raise ValueError(
            f"sequence length {seqlen} exceeds the {what} (model.max_seq_len={max_seq_len}); "
            f"allowed: seq_len <= {max_seq_len}. Build the model with a larger max_seq_len "
            "(configs set it from ${seq_len}) and load shorter checkpoints with "
            "model.init_from / load_state_dict_extended"
        )


def token_positions(
    input_ids: torch.Tensor, position_ids: torch.Tensor | None, max_seq_len: int | None
) -> torch.Tensor:
    """The positions of input_ids' (B, T) tokens: position_ids (B, T) int64 as given (global
    positions, each below max_seq_len), or (1, T) 0..T-1 after checking T against max_seq_len
    (None: no positional table, no limit)."""
    if position_ids is None:
        seqlen = input_ids.shape[1]
        if max_seq_len is not None:
            check_seq_len(seqlen, max_seq_len)
        return torch.arange(seqlen, device=input_ids.device)[None]  # (1, T)
    if position_ids.shape != input_ids.shape or position_ids.dtype != torch.int64:
        raise ValueError(
            f"position_ids must be int64 with the shape of input_ids {tuple(input_ids.shape)}, "
            f"got {position_ids.dtype} {tuple(position_ids.shape)}"
        )
    return position_ids


# ---- rotary ------------------------------------------------------------------------------------


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the head dim (GPT-NeoX layout). x (..., H, D); cos, sin (..., 1, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# ---- 2-D ---------------------------------------------------------------------------------------


def grid_positions(row: torch.Tensor, col: torch.Tensor, seqlen: int) -> torch.Tensor:
    """(T, C) embeddings of a row-major side x side image: pos[r, c] = row[r] + col[c].

    row, col: (side, C) tables; seqlen must be side * side."""
    side = row.shape[0]
    if seqlen != side * side:
        raise ValueError(
            f"position=2d: sequence length {seqlen} is not this model's image of "
            f"{side}x{side} = {side * side} pixels; allowed: seq_len == {side * side} "
            "(build the model for the new image size and load with init_from to upsample)"
        )
    grid = row[:, None, :] + col[None, :, :]  # (S, S, C)
    return grid.reshape(side * side, -1)  # (T, C), row-major like the flattened image


# ---- resizing ----------------------------------------------------------------------------------


def resize_positions(table: torch.Tensor, new_len: int, mode: str = "interpolate") -> torch.Tensor:
    """A (L, C) positional table resized to (new_len, C).

    interpolate: linear interpolation along positions (align_corners=False), the usual way to move
        learned positions to a longer context or a larger image side.
    copy: the old table repeated to fill the new length (Longformer's initialisation), cut if shorter.
    """
    old_len = table.shape[0]
    if new_len == old_len:
        return table.clone()
    if mode == "copy":
        reps = math.ceil(new_len / old_len)
        return table.repeat(reps, 1)[:new_len].clone()
    if mode == "interpolate":
        t = table.float().t()[None]  # (1, C, L)
        out = F.interpolate(t, size=new_len, mode="linear", align_corners=False)
        return out[0].t().to(table.dtype).contiguous()  # (new_len, C)
    raise ValueError(f"position resize mode {mode!r}; allowed: {', '.join(POSITION_RESIZE_MODES)}")


def resize_nearest(table: torch.Tensor, new_len: int) -> torch.Tensor:
    """(L, C) -> (new_len, C), each old row covering new_len / L new rows (image axes)."""
    idx = (torch.arange(new_len) * table.shape[0]) // new_len
    return table[idx.to(table.device)].clone()


def resize_position_tables(
    state_dict: dict, own: dict, tables: dict[str, str], mode: str = "interpolate"
) -> dict:
    """A copy of state_dict whose positional tables have the lengths of this model's (`own`).

    tables: state-dict key -> "1d" (a sequence axis) or "2d" (an image axis). 1-D tables:
    "interpolate" (linear) or "copy" (tile the old table). 2-D row/column tables (an image side,
    e.g. 64 -> 128 pixels): "interpolate" (linear, which is bilinear on the row + column sum) or
    "copy" (nearest: each old row covers several).
    """
    if mode not in POSITION_RESIZE_MODES:
        raise ValueError(f"mode={mode!r}; allowed: {', '.join(POSITION_RESIZE_MODES)}")
    state = dict(state_dict)
    for key, kind in tables.items():
        if key not in state or key not in own or state[key].shape == own[key].shape:
            continue
        old, new_len = state[key], own[key].shape[0]
        if old.shape[1:] != own[key].shape[1:]:
            raise ValueError(
                f"{key}: checkpoint width {tuple(old.shape)} does not match {tuple(own[key].shape)}"
            )
        if kind == "2d" and mode == "copy":
            state[key] = resize_nearest(old, new_len)
        else:
            state[key] = resize_positions(old, new_len, mode)
    return state
