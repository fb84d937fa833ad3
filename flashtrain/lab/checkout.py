"""Where things are in the checkout. The lab (this package) is the only code that knows the
repository's layout; the library below it (flashtrain.train and down) never does."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"  # train.yaml and the Hydra config groups
TRAIN_SCRIPT = REPO / "train.py"
RESULTS = REPO / "benchmarks" / "results"  # measured figures, committed
TESTS = REPO / "tests"
