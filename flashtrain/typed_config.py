"""The one way a config section becomes its typed dataclass.

Every config group has a dataclass (its schema; Hydra composes each YAML group option on top of
it, see flashtrain/train/config_store.py). Code below the trainer takes either an instance or a
mapping (a Hydra DictConfig, a plain dict): `to_dataclass` merges the mapping into the schema with
OmegaConf, so an unknown key, a wrong type or a missing required value fails here, naming the key
and what is allowed; then every float field must be finite (NaN or +-inf only where the field's
declaration allows it: `field(default=..., metadata=nonfinite_allowed("why"))`), and the
dataclass's __post_init__ checks the values. Groups with several schemas (model, attention,
data) pick one by a discriminator key (`arch`, `impl`, `loader`) whose default each schema sets:
`typed_group`, and a `Registry` derives such a group from the classes it builds (each carries
its schema as `Config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""


def field_names(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def _plain(cfg: Any, what: str) -> dict:
    """A resolved plain dict of a mapping (interpolations resolved, `???` kept as `???`)."""
    if isinstance(cfg, Mapping) and not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(dict(cfg))
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    raise ConfigError(f"{what} must be a mapping (dict or DictConfig), got {type(cfg).__name__}")


def _key(what: str, key: Any) -> str:
    """A dotted key below the section `what` ("" for the root config)."""
    return f"{what}.{key}" if what else str(key)


def describe_unknown_key(
    error: BaseException, what: str = "", elsewhere: Mapping[str, Iterable[type]] | None = None
) -> str | None:
    """For OmegaConf's "Key 'x' not in 'Schema'" errors: the key, the closest allowed keys (did you
    mean ...?) and the schema's keys, else None. elsewhere: {section: its schemas} of sections the
    error's schema does not reach (the groups whose schema another key picks: model, data, ...),
    searched for the same name (a top-level `max_steps` is `trainer.max_steps`)."""
    for err in (error, error.__cause__, error.__context__):
        if not isinstance(err, (ConfigKeyError, ConfigAttributeError)):
            continue
        schema = getattr(err, "object_type", None)
        if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
            continue
        full_key = _key(what, err.full_key)
        section, _, name = full_key.rpartition(".")
        guesses = closest_keys(name, schema, section, elsewhere or {})
        guess = f" (did you mean {' or '.join(guesses)}?)" if guesses else ""
        return (
            f"unknown key '{full_key}'{guess}; allowed keys of {section or 'the config'} "
            f"({schema.__name__}): {', '.join(field_names(schema))}"
        )
    return None


def closest_keys(
    name: str, schema: type, section: str = "", elsewhere: Mapping[str, Iterable[type]] = {}
) -> list[str]:
    """Up to three dotted keys a misspelt `name` in `section` (whose schema is `schema`) most
    likely meant: a close field name of the same schema first, then the same or a close name one
    level down (a dataclass-typed field's own fields) or in the `elsewhere` sections."""
    own = difflib.get_close_matches(name, field_names(schema), n=2, cutoff=0.75)
    guesses = [_key(section, f) for f in own]
    below: dict[str, set[str]] = {}
    hints = _field_types(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            below.setdefault(_key(section, f.name), set()).update(field_names(hints[f.name]))
    for where, schemas in elsewhere.items():
        if where != section:
            for other in schemas:
                below.setdefault(where, set()).update(field_names(other))
    for where, names in below.items():
        for f in difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.85):
            guesses.append(_key(where, f))
    return guesses[:3]


NONFINITE = "nonfinite"  # the field metadata key of a float field that may be NaN or +-inf


def nonfinite_allowed(why: str) -> dict[str, str]:
    """dataclasses.field metadata of a float field that may hold NaN or +-inf; `why` says what
    such a value means (e.g. "inf: no limit"). Every other float field must be finite."""
    return {NONFINITE: why}


@functools.cache
def _field_types(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)  # the annotations resolved (they are strings here)


def check_finite(schema: type, values: Any, what: str) -> None:
    """Refuse a NaN or +-inf in a float field of `schema` (float, float | None, list[float],
    nested dataclasses), naming its dotted key, unless its metadata allows it (nonfinite_allowed).
    values: a mapping of the fields or an instance of `schema`; fields of type Any (a group
    whose schema another key picks) are checked when that group is."""
    types_ = _field_types(schema)
    for f in dataclasses.fields(schema):
        if f.metadata.get(NONFINITE):
            continue
        value = values.get(f.name) if isinstance(values, Mapping) else getattr(values, f.name, None)
        _check_finite_value(types_[f.name], value, _key(what, f.name))


def _check_finite_value(hint: Any, value: Any, key: str) -> None:
    if value is None or isinstance(value, (bool, str)):
        return  # str: OmegaConf's "???" (required, unset); converted floats arrive as floats
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            _check_finite_value(arg, value, key)
    elif origin in (list, tuple) and args and isinstance(value, Iterable):
        for i, item in enumerate(value):
            _check_finite_value(args[0], item, f"{key}[{i}]")
    elif dataclasses.is_dataclass(hint) and (isinstance(value, Mapping) or isinstance(value, hint)):
        check_finite(hint, value, key)


def to_dataclass(schema: type[T], cfg: Any, *, what: str) -> T:
    """`cfg` (an instance of `schema`, or a mapping) as a checked instance of `schema`.

    what: the section's key for messages ("data", "trainer"; "" for the root config)."""
    if isinstance(cfg, schema):
        check_finite(schema, cfg, what)
        return cfg
    data = _plain(cfg, what)
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), data)
        # before __post_init__, whose range checks a NaN passes (every comparison is False)
        check_finite(schema, OmegaConf.to_container(node, resolve=True), what)
        return OmegaConf.to_object(node)
    except (ConfigKeyError, ConfigAttributeError) as e:
        raise ConfigError(describe_unknown_key(e, what) or f"{what or 'config'}: {e}") from None
    except MissingMandatoryValue as e:
        raise ConfigError(f"{_key(what, e.full_key)} is required (no default); set it") from None
    except ValidationError as e:
        raise ConfigError(f"{_key(what, e.full_key)}: {e.msg}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{what or 'config'}: {e}") from None
    except ConfigError:
        raise
    except ValueError as e:  # a dataclass's own check (__post_init__)
        raise ConfigError(str(e)) from None


def typed_group(cfg: Any, schemas: Mapping[str, type], *, key: str, what: str) -> Any:
    """A config group with several schemas: `cfg[key]` (e.g. model.arch) picks the schema."""
    is_instance = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    choice = getattr(cfg, key, None) if is_instance else _plain(cfg, what).get(key)
    if choice not in schemas:
        raise ConfigError(f"{_key(what, key)}={choice!r}; allowed: {', '.join(schemas)}")
    schema = schemas[choice]
    if is_instance and not isinstance(cfg, schema):
        raise ConfigError(
            f"{_key(what, key)}={choice!r} belongs to {schema.__name__}, not {type(cfg).__name__}"
        )
    return to_dataclass(schema, cfg, what=what)


class Registry:
    """The buildable classes of one config group (models, data loaders, attention impls), each
    carrying its schema as the class attribute `Config`, whose `key` field's default names it
    (GPT2.Config.arch == "gpt2"). Every table is derived from the list of classes:

        MODELS = Registry("arch", "model", [GPT2, Bert, SequenceClassifier])
        MODELS.classes   # {"gpt2": GPT2, ...}: what a config builds
        MODELS.configs   # {"gpt2": GPT2Config, ...}: the schemas (Hydra's ConfigStore, checks)
        MODELS.config(cfg)   # a mapping or an instance -> its checked dataclass

    A new entry is one more class in the list; the names must be unique.
    """

    def __init__(self, key: str, what: str, classes: Iterable[type]):
        self.key, self.what = key, what
        self.classes: dict[str, type] = {}
        for cls in classes:
            name = getattr(cls.Config, key)
            if not name or name in self.classes:
                raise ValueError(
                    f"{cls.__name__}.Config.{key}={name!r}: a {what} needs its own non-empty {key}"
                )
            self.classes[name] = cls
        self.configs: dict[str, type] = {name: c.Config for name, c in self.classes.items()}

    def config(self, cfg: Any) -> Any:
        """The checked dataclass of the entry `cfg[key]` names, from an instance or a mapping."""
        return typed_group(cfg, self.configs, key=self.key, what=self.what)

    def build_class(self, cfg: Any) -> type:
        """The class a checked config (a dataclass instance) builds."""
        return self.classes[getattr(cfg, self.key)]


def check_choice(value: Any, allowed: tuple | list, key: str) -> None:
    """A ValueError naming the key, the value and the allowed ones (for __post_init__ checks)."""
    if value not in allowed:
        raise ValueError(f"{key}={value!r}; allowed: {', '.join(map(str, allowed))}")
