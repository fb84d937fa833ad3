"""Generate Pathfinder images with a progress bar, report the rate, save a PNG grid of examples.

    python scripts/make_pathfinder.py --resolution 128 --num 10000          # Path-X, cached
    python scripts/make_pathfinder.py --resolution 32 --num 16 --no-cache --grid docs/pathfinder_32.png

With a cache (the default) the images land where the pathfinder data configs read them
(<cache_dir>/pathfinder/...), so training starts without generating again. An interrupted run
(Ctrl-C, SIGTERM, kill -9) keeps its finished chunks: run the same command again to continue.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def save_grid(images: np.ndarray, labels: np.ndarray, path: Path, columns: int = 4) -> None:
    """A PNG of the first images with their labels ("same" / "different") as titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = min(len(images), columns * 2)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.8 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, image, label in zip(axes.ravel(), images[:count], labels[:count]):
        ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(f"label {label}: {'same' if label else 'different'}", fontsize=9)
    size = images.shape[1]
    fig.suptitle(f"Pathfinder {size}x{size} ({size * size} tokens)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95), h_pad=1.5)
    from flashtrain.data.files import atomic_path

    with atomic_path(path) as tmp:  # a killed run never leaves half a PNG
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--resolution", type=int, default=128, choices=(32, 64, 128, 256))
    parser.add_argument("--num", type=int, default=10_000)
    parser.add_argument("--contour-length", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument("--cache-dir", default=os.environ.get("FLASHTRAIN_DATA", "data_cache"))
    parser.add_argument("--no-cache", action="store_true", help="generate in memory only")
    parser.add_argument(
        "--grid", type=Path, default=None, help="PNG path (default docs/pathfinder_R.png)"
    )
    args = parser.parse_args()

    from flashtrain.data.pathfinder import generate_pathfinder
    from flashtrain.data.pathfinder.cache import load_or_generate
    from flashtrain.data.pathfinder.generator import all_cores

    workers = args.workers or all_cores()

    start = time.perf_counter()
    if args.no_cache:
        images, labels = generate_pathfinder(
            args.num,
            args.resolution,
            args.contour_length,
            args.seed,
            num_workers=workers,
            progress=True,
        )
    else:
        images, labels = load_or_generate(
            Path(args.cache_dir),
            args.resolution,
            args.contour_length,
            args.num,
            args.seed,
            num_workers=workers,
            progress=True,
        )
    seconds = time.perf_counter() - start
    print(
        f"{len(images)} images {args.resolution}x{args.resolution}, contour length "
        f"{args.contour_length}: {seconds:.1f} s = {len(images) / seconds:.1f} images/s "
        f"({workers} worker processes); label 1 fraction {labels.mean():.3f}"
    )
    grid = args.grid or Path("docs") / f"pathfinder_{args.resolution}.png"
    save_grid(np.asarray(images[:8]), np.asarray(labels[:8]), grid)
    print(f"example grid: {grid}")


if __name__ == "__main__":
    main()
