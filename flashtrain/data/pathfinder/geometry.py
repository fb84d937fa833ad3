"""Vectorised 2-D geometry for the Pathfinder generator: distances, an occupancy raster, drawing.

Coordinates are continuous (y, x) in pixels; pixel (i, j) covers [i, i+1) x [j, j+1), so its centre
is (i + 0.5, j + 0.5). A segment is stored as the last axis (y0, x0, y1, x1).
"""

from __future__ import annotations

import functools
import math

import numpy as np


def point_segment_distance(py, px, seg):
    """Distance from points (py, px) to segments seg (..., 4); all arguments broadcast."""
    y0, x0, y1, x1 = seg[..., 0], seg[..., 1], seg[..., 2], seg[..., 3]
    dy, dx = y1 - y0, x1 - x0
    length_sq = dy * dy + dx * dx
    # Projection of the point on the segment's line, clamped onto the segment; a zero-length
    # segment (a marker centre) projects onto its only point.
    t = ((py - y0) * dy + (px - x0) * dx) / np.where(length_sq > 0, length_sq, 1.0)
    t = np.minimum(np.maximum(t, 0.0), 1.0)
    ny, nx = y0 + t * dy - py, x0 + t * dx - px
    return np.sqrt(ny * ny + nx * nx)


def segments_cross(a, b):
    """Whether segments a (..., 4) and b (..., 4) properly cross (broadcasting)."""
    ady, adx = a[..., 2] - a[..., 0], a[..., 3] - a[..., 1]
    bdy, bdx = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    # Each segment's endpoints lie strictly on opposite sides of the other's line.
    s1 = ady * (b[..., 1] - a[..., 1]) - adx * (b[..., 0] - a[..., 0])
    s2 = ady * (b[..., 3] - a[..., 1]) - adx * (b[..., 2] - a[..., 0])
    s3 = bdy * (a[..., 1] - b[..., 1]) - bdx * (a[..., 0] - b[..., 0])
    s4 = bdy * (a[..., 3] - b[..., 1]) - bdx * (a[..., 2] - b[..., 0])
    return (s1 * s2 < 0) & (s3 * s4 < 0)


def segment_distance(a, b):
    """Shortest distance between segments a (..., 4) and b (..., 4), broadcasting; 0 if they cross."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    # Without a crossing, the closest pair of points includes an endpoint of one of the segments.
    d = np.minimum(
        np.minimum(
            point_segment_distance(a[..., 0], a[..., 1], b),
            point_segment_distance(a[..., 2], a[..., 3], b),
        ),
        np.minimum(
            point_segment_distance(b[..., 0], b[..., 1], a),
            point_segment_distance(b[..., 2], b[..., 3], a),
        ),
    )
    return np.where(segments_cross(a, b), 0.0, d)


def _patches(segments, reach: float, size: int, scale: int):
    """Cell grids around each segment: rows (N, P, 1), cols (N, 1, P) of a size*scale raster."""
    lo_y = np.floor((np.minimum(segments[:, 0], segments[:, 2]) - reach) * scale).astype(np.int64)
    lo_x = np.floor((np.minimum(segments[:, 1], segments[:, 3]) - reach) * scale).astype(np.int64)
    span = np.maximum(
        np.abs(segments[:, 2] - segments[:, 0]), np.abs(segments[:, 3] - segments[:, 1])
    ).max()
    offsets = np.arange(int(math.ceil((span + 2 * reach) * scale)) + 2)
    return lo_y[:, None, None] + offsets[None, :, None], lo_x[:, None, None] + offsets[
        None, None, :
    ]


@functools.lru_cache(maxsize=8)
def _unit_steps(samples: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, samples)


class OccupancyRaster:
    """Where a new paddle's centre line may not go: the union of a keep-out disc-swept zone
    ("capsule") around every object placed so far, on a raster `scale` times finer than pixels.

    `blocks` is conservative: a candidate found free keeps at least the requested clearance from
    every stamped object exactly, because stamps are widened by the largest error of sampling the
    candidate at points 1/scale apart and reading the cell that holds each point.
    """

    def __init__(self, size: int, scale: int = 2):
        self.size, self.scale = size, scale
        self.cells = np.zeros((size * scale, size * scale), dtype=bool)
        self.slack = (math.sqrt(0.5) + 0.5) / scale

    def stamp(self, segments: np.ndarray, clearance: float) -> None:
        """Mark every cell whose centre lies within clearance (+ slack) of a segment (N, 4)."""
        reach = clearance + self.slack
        rows, cols = _patches(segments, reach, self.size, self.scale)
        centre_y, centre_x = (rows + 0.5) / self.scale, (cols + 0.5) / self.scale
        near = point_segment_distance(centre_y, centre_x, segments[:, None, None, :]) <= reach
        rows, cols = np.broadcast_arrays(rows, cols)
        limit = self.size * self.scale
        keep = near & (rows >= 0) & (rows < limit) & (cols >= 0) & (cols < limit)
        self.cells[rows[keep], cols[keep]] = True

    def blocks(self, segments: np.ndarray, samples: int) -> np.ndarray:
        """(N,) bool: whether segments (N, 4), lying inside the frame, meet a stamped zone.

        samples: points checked along each segment; at least length * scale + 1.
        """
        t = _unit_steps(samples)
        ys = segments[:, 0, None] + t * (segments[:, 2, None] - segments[:, 0, None])  # (N, S)
        xs = segments[:, 1, None] + t * (segments[:, 3, None] - segments[:, 1, None])
        return self.cells[
            (ys * self.scale).astype(np.int64), (xs * self.scale).astype(np.int64)
        ].any(axis=1)


def draw_segments(canvas, segments, thickness: float, intensity: float):
    """Draw anti-aliased thick segments (N, 4) into canvas (R, R) float in place, combining by max.

    A pixel's coverage falls linearly from 1 to 0 as its centre goes from thickness/2 - 0.5 to
    thickness/2 + 0.5 away from the centre line: a box-filter estimate of the covered area.
    """
    if len(segments) == 0:
        return canvas
    size = canvas.shape[0]
    half = thickness / 2.0
    rows, cols = _patches(segments, half + 1.0, size, 1)
    dist = point_segment_distance(rows + 0.5, cols + 0.5, segments[:, None, None, :])  # (N, P, P)
    cover = np.clip(half + 0.5 - dist, 0.0, 1.0) * intensity
    rows, cols = np.broadcast_arrays(rows, cols)
    inside = (rows >= 0) & (rows < size) & (cols >= 0) & (cols < size) & (cover > 0)
    np.maximum.at(canvas.reshape(-1), rows[inside] * size + cols[inside], cover[inside])
    return canvas


def draw_discs(canvas, centres, radius: float, intensity: float = 1.0):
    """Draw anti-aliased filled discs (markers) at centres (M, 2) into canvas in place (max)."""
    size = canvas.shape[0]
    rows = np.arange(size)[:, None] + 0.5
    cols = np.arange(size)[None, :] + 0.5
    for cy, cx in centres:
        dist = np.sqrt((rows - cy) ** 2 + (cols - cx) ** 2)
        np.maximum(canvas, np.clip(radius + 0.5 - dist, 0.0, 1.0) * intensity, out=canvas)
    return canvas
