"""Checkpoint stall on a CPU: the training step's wait for a checkpoint, synchronous saves against
saves written in the background (trainer.async_checkpoint), side by side in one run (~3 minutes).

python scripts/checkpoint_stall.py [--out benchmarks/results] [--name NAME] [--saves 3]
    (the logic: flashtrain.lab.bench.checkpoint_stall)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.checkpoint_stall import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
