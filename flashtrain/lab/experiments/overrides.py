"""Hydra overrides as the tables and the driver handle them, and the value a run gets for a key:
its last override, else the experiment preset it names (configs/experiment/<name>.yaml and the
presets that one builds on), read as plain YAML without composing the whole config."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import yaml

from flashtrain.lab.checkout import CONFIGS

PRESETS = CONFIGS / "experiment"


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*groups: Sequence[str]) -> list[str]:
    """The overrides in order of first appearance, each key with its last value."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override_key(override)] = override
    return list(merged.values())


def override_value(overrides: Sequence[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    return values[-1] if values else None


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@cache
def preset_settings(name: str) -> dict[str, object]:
    """{dotted key: value} that preset `name` sets, the presets it builds on first (a
    `- /experiment/<other>` entry in its defaults list); group choices ("override /model:
    gpt2") as "model": "gpt2"."""
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no experiment preset {name}: {path} does not exist")
    tree = yaml.safe_load(path.read_text()) or {}
    settings: dict[str, object] = {}
    for entry in tree.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            settings.update(preset_settings(entry.removeprefix("/experiment/")))
        elif isinstance(entry, dict):
            for group, choice in entry.items():
                settings[group.removeprefix("override ").strip("/")] = choice
    settings.update(_flat(tree))
    return settings


def setting(overrides: Sequence[str], key: str) -> str | None:
    """The value of `key` for a run with these overrides (as text, like an override's), or None
    where neither the overrides nor the preset they name set it."""
    value = override_value(overrides, key)
    if value is not None:
        return value
    preset = override_value(overrides, "experiment")
    if preset is None:
        return None
    found = preset_settings(preset).get(key)
    if found is None:
        return "null" if key in preset_settings(preset) else None
    return str(found).lower() if isinstance(found, bool) else str(found)
