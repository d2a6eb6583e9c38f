"""Helpers shared by the frozen config dataclasses: CLI flags generated from fields, and their environment
variables.

Every field is a flag (`kv_lease_s` -> `--kv-lease-s`) and a variable (`PDSERVE_KV_LEASE_S`, `env_name`), unless
its metadata names another variable (`doc(..., env=...)`: the router's `workers` is `PDSERVE_ROUTER_WORKERS`).
`config_from_args` is the one place that reads the variables: a flag given wins, else the variable, else the
field's default. A variable's value is parsed with the field's type, as the flag's would be; a bool is one of
1/0/true/false/yes/no (any case); for an `X | None` field the empty string is None. Variables of fields the
config does not have (a typo, another service's flag) are ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from common.errors import InvalidArgumentError

T = TypeVar("T")

ENV_PREFIX = "PDSERVE_"
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


class ConfigValueError(InvalidArgumentError):
    """A bad config value. `field` is the dataclass field; `source` names where the value came from: its flag
    (`--num-blocks`) or its variable (`PDSERVE_NUM_BLOCKS`). `str()` is `<source>: <description>`."""

    def __init__(self, field: str, source: str, message: str) -> None:
        super().__init__(field, message)
        self.source = source

    def __str__(self) -> str:
        return f"{self.source}: {self.description}"


def env_name(dest: str) -> str:
    """The environment variable of the flag with destination `dest`: `kv_lease_s` -> `PDSERVE_KV_LEASE_S`."""
    return ENV_PREFIX + dest.upper()


def _flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _variable(field: dataclasses.Field[Any], prefix: str) -> str:
    """The environment variable of `field`: the one its metadata names, else `env_name` of its flag."""
    named: str | None = field.metadata.get("env")
    return named or env_name(prefix + field.name)


def _flag_type(tp: Any) -> tuple[type, bool]:
    """(scalar type for argparse, optional?) of a field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _init_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def add_config_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one `--flag` per dataclass field; the field's `doc` metadata, its variable and its default are the
    help text."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for field in _init_fields(cls):
        tp, _ = _flag_type(hints[field.name])
        dest = prefix + field.name
        help_text = f"{field.metadata.get('doc', '')} (env {_variable(field, prefix)}; default: {field.default})"
        if tp is bool:
            group.add_argument(
                _flag_name(dest),
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(_flag_name(dest), dest=dest, type=tp, default=argparse.SUPPRESS, help=help_text)


def _parse_env(field: str, name: str, annotation: Any, raw: str) -> Any:
    """The value of variable `name` (of `field`) as the field's type; ConfigValueError naming it if it is none."""
    tp, optional = _flag_type(annotation)
    if optional and raw == "":
        return None
    if tp is bool:
        if raw.lower() not in _BOOLS:
            raise ConfigValueError(field, name, f"invalid bool value {raw!r} (one of {', '.join(_BOOLS)})")
        return _BOOLS[raw.lower()]
    try:
        return tp(raw)
    except ValueError:
        raise ConfigValueError(field, name, f"invalid {tp.__name__} value {raw!r}") from None


def _env_values(cls: type, prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields of `cls` that `environ` sets, parsed."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in _init_fields(cls):
        name = _variable(field, prefix)
        if name in environ:
            values[field.name] = _parse_env(field.name, name, hints[field.name], environ[name])
    return values


def config_from_args(
    cls: type[T],
    args: argparse.Namespace,
    prefix: str = "",
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> T:
    """Build `cls` from the flags `add_config_args` added, else the `PDSERVE_*` variables of `environ`
    (default: os.environ, read now), else the defaults; `overrides` win over both.

    Raises ConfigValueError naming the variable or the flag of a bad value (unparsable, or refused by `cls`).
    """
    env = os.environ if environ is None else environ
    from_env = _env_values(cls, prefix, env)
    from_flags = {f.name: getattr(args, prefix + f.name) for f in _init_fields(cls) if hasattr(args, prefix + f.name)}
    try:
        return cls(**{**from_env, **from_flags, **overrides})
    except InvalidArgumentError as exc:
        # NOTE: `exc.field` is the dataclass field the check names; it came from the environment only if
        # neither a flag nor an override set it.
        from_env_only = exc.field in from_env and exc.field not in from_flags and exc.field not in overrides
        fields = {f.name: f for f in _init_fields(cls)}
        source = _variable(fields[exc.field], prefix) if from_env_only else _flag_name(prefix + exc.field)
        raise ConfigValueError(exc.field, source, exc.description) from None


def doc(text: str, env: str | None = None) -> dict[str, str]:
    """Field metadata carrying its one-line doc (used for --help) and, when it is not `env_name` of the field, the
    name of its environment variable."""
    return {"doc": text} if env is None else {"doc": text, "env": env}
