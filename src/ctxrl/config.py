"""Typed configs: one generic loader for every dataclass schema in ctxrl.

A config class is a (frozen) dataclass whose fields carry the defaults; YAML files and command-line
overrides only override fields. ``load_config(cls, source, overrides)`` builds an instance:

    cfg = load_config(RunConfig, "configs/rollout.yaml", ["harness.budget=16000", "rollout.group_size=8"])

Contract:

- ``source`` is ``None`` (all defaults), a mapping, or the path of a YAML file holding a mapping.
- ``overrides`` are ``dotted.key=value`` strings; the value is read as YAML (``10`` is an int, ``true`` a
  bool, ``[0.2, 0.5]`` a list).
- Nested dataclass fields take nested mappings. An unknown key raises :class:`ConfigError` naming the key
  and the nearest valid name; a value of the wrong type raises one naming the field and the expected type.
- Errors a schema raises in ``__post_init__`` (``ValueError``/``ConfigError``) come out as
  :class:`ConfigError` prefixed with the field path, so range checks stay next to the fields.

Supported field types: ``bool``, ``int``, ``float`` (an int is accepted), ``str``, ``pathlib.Path``,
``Literal[...]``, ``X | None``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]`` and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ctxrl.errors import ConfigError

T = TypeVar("T")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def load_config(
    cls: type[T], source: Mapping[str, Any] | str | Path | None = None, overrides: Sequence[str] = ()
) -> T:
    """Build ``cls`` from ``source`` plus dotted ``key=value`` overrides; raise ConfigError on bad input."""
    data = _read_source(source)
    for item in overrides:
        _apply_override(data, item)
    return _build(cls, data, prefix="")


SEED_LIMIT = 2**31
"""Every ``seed`` setting lies in ``[0, SEED_LIMIT)``."""

_YAML_BOOL_WORDS = {True: ("yes", "on", "true", "y"), False: ("no", "off", "false", "n")}
"""The words YAML 1.1 reads as a boolean (PyYAML's ``safe_load``), by the boolean they become."""


def _read_source(source: Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return _deep_copy_mapping(source)
    path = Path(source)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text (save it as UTF-8)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(exc)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"{path} must hold a mapping of config keys, not a {type(loaded).__name__}")
    return _deep_copy_mapping(loaded)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: the problem and where (line and column, 1-based)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def _deep_copy_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy_mapping(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _apply_override(data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key=value (e.g. budget=16000)")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # not YAML: keep the text; the type check says what was expected
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _build(cls: type[T], data: Any, prefix: str) -> T:
    name = prefix.rstrip(".") or cls.__name__
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name} must be a mapping of keys, not {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(_unknown_key_message(prefix, str(key), fields, hints))
    kwargs = {key: _coerce(hints[key], value, prefix + key) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _unknown_key_message(prefix: str, key: str, fields: Mapping[str, Any], hints: Mapping[str, Any]) -> str:
    """Names the key one section down when it lives there (``train.tis_cap`` is ``train.loss.tis_cap``),
    else the nearest name in this section or the next one down, else the valid keys."""
    down = {  # the last part -> the key path under this section
        f"{name}.{sub.name}": sub.name
        for name in fields
        if dataclasses.is_dataclass(hints[name])
        for sub in dataclasses.fields(hints[name])
    }
    moved = [path for path, last in down.items() if last == key]
    if moved:
        return f"unknown config key {prefix + key!r}; it is {' or '.join(repr(prefix + p) for p in moved)}"
    near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
    if not near:
        lower = difflib.get_close_matches(key, list(down.values()), n=1, cutoff=0.75)
        near = [path for path, last in down.items() if lower and last == lower[0]][:1]
    hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(sorted(fields))}"
    return f"unknown config key {prefix + key!r}{hint}"


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert lists to tuples/dataclasses where needed."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return value if isinstance(value, tp) else _build(tp, value, path + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(option, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of {_type_name(tp)}"
        )
    if origin is typing.Literal:
        if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
            return value
        if isinstance(value, bool):
            # YAML 1.1 reads an unquoted no/yes/off/on as a boolean; give the word back where it is a choice
            words = [a for a in args if isinstance(a, str) and a.lower() in _YAML_BOOL_WORDS[value]]
            if len(words) == 1:
                return words[0]
        raise ConfigError(f"{path} must be one of {', '.join(repr(a) for a in args)}, not {value!r}")
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list ({_type_name(tp)}), not {value!r}")
        homogeneous = origin is list or (len(args) == 2 and args[1] is Ellipsis)
        if not homogeneous and len(args) != len(value):
            raise ConfigError(f"{path} must have {len(args)} items ({_type_name(tp)}), not {len(value)}")
        item_types = [args[0]] * len(value) if homogeneous else list(args)
        items = [_coerce(t, v, f"{path}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
        return tuple(items) if origin is tuple else items
    return _coerce_scalar(tp, value, path)


def _coerce_scalar(tp: Any, value: Any, path: str) -> Any:
    # bool is a subclass of int in Python; a YAML `true` where a number is expected is a mistake.
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        if path.rpartition(".")[2] == "seed" and not 0 <= value < SEED_LIMIT:
            # NumPy (and so vLLM and accelerate) takes seeds below 2**32 and torch below 2**64; a run adds its
            # rank or round to its seed, so the room above 2**31 stays free
            raise ConfigError(f"{path} must be an integer from 0 to {SEED_LIMIT - 1}, not {value}")
        return value
    # YAML 1.1 (PyYAML) reads ``5e-4``, without a dot, as text
    numeric = isinstance(value, int | float) or (isinstance(value, str) and _FLOAT.fullmatch(value.strip()))
    if tp is float and numeric and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number):  # YAML's .nan and .inf, 1e999: every check after this would pass a NaN
            raise ConfigError(f"{path} must be a finite number, not {value!r}")
        return number
    if tp is str and isinstance(value, str):
        return value
    if tp is Path and isinstance(value, str | Path):
        return Path(value)
    if tp is Any:
        return value
    raise ConfigError(f"{path} must be {_type_name(tp)}, not {value!r} ({type(value).__name__})")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
