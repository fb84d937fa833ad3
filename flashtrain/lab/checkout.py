"""Where things are in the checkout. The lab (this package) is the only code that knows the
repository's layout; the library below it (flashtrain.train and down) never does.

Importing it (every part of the lab does, through flashtrain/lab/__init__.py) also makes a
checkout that is not installed complete: setup.py installs the top-level kernels/ folder as
flashtrain.kernels, and a plain checkout on PYTHONPATH (a GPU machine's copy of the tree) has
no such package until use_checkout_kernels() maps it. `pytest -p flashtrain.lab.checkout` does
the same for a test run from such a checkout.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"  # train.yaml and the Hydra config groups
TRAIN_SCRIPT = REPO / "train.py"
RESULTS = REPO / "benchmarks" / "results"  # measured figures, committed
TESTS = REPO / "tests"
KERNELS = REPO / "kernels"  # installed as flashtrain.kernels


class CheckoutKernels(importlib.abc.MetaPathFinder):
    """Finds flashtrain.kernels in the checkout's kernels/; last on sys.meta_path, so an
    installed (or editable) flashtrain.kernels is always found first."""

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002
        if name != "flashtrain.kernels":
            return None
        init = KERNELS / "__init__.py"
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(KERNELS)]
        )


def use_checkout_kernels() -> None:
    if (KERNELS / "__init__.py").is_file() and not any(
        isinstance(f, CheckoutKernels) for f in sys.meta_path
    ):
        sys.meta_path.append(CheckoutKernels())


use_checkout_kernels()
