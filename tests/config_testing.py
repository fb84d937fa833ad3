"""Composing configs/train.yaml in tests exactly as train.py does (Hydra, the registered schemas)."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
if str(REPO) not in sys.path:  # the package may not be pip-installed
    sys.path.insert(0, str(REPO))


def compose(overrides: list[str] | tuple[str, ...] = ()):
    """configs/train.yaml with overrides, as train.py would see it (minus the hydra node).

    A copy of the config composed for the same overrides earlier in this process: the files do
    not change during a run, and of the suite's ~370 composes ~140 repeat one (0.1-0.25 s each,
    a copy ~2 ms). Interpolations stay unresolved in the copy, as in a fresh compose."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.cache
def _composed(overrides: tuple[str, ...]):
    """The one composed config per overrides; never handed out (tests change theirs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    _register_schemas_once()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


@functools.cache
def _register_schemas_once() -> None:
    """train.py registers once per process too; again costs ~0.06 s a compose, hundreds of them."""
    from flashtrain.train import register_schemas

    register_schemas()


def group_options(group: str) -> list[str]:
    """The options of a config group: configs/<group>/**/*.yaml without the suffix."""
    root = CONFIGS / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def train_testing():
    """tests/train/train_testing.py (TINY, run_train, subprocess_env, the metrics readers) for a
    test outside tests/train: that folder is on sys.path only when one of its modules was
    collected, so the module is loaded from its file otherwise."""
    if "train_testing" not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "train_testing", REPO / "tests" / "train" / "train_testing.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["train_testing"] = module
        spec.loader.exec_module(module)
    return sys.modules["train_testing"]
