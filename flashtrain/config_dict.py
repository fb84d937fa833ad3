"""One way to read a config section: OmegaConf DictConfig or Mapping in, a plain resolved dict out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def to_plain_dict(cfg: Any, *, what: str) -> dict:
    """Interpolations (${...}, ${oc.env:...}) resolved; mandatory values left unset (`???`) become
    None so the consumer's own check names the missing key; None gives {}."""
    from omegaconf import DictConfig, OmegaConf

    if cfg is None:
        return {}
    if isinstance(cfg, Mapping) and not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(dict(cfg))
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"{what} must be a mapping (dict or DictConfig), got {type(cfg).__name__}")
    missing = [key for key in cfg if OmegaConf.is_missing(cfg, key)]
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.update(dict.fromkeys(missing))
    return plain
