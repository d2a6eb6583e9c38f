"""Helpers shared by the frozen config dataclasses: CLI flags generated from fields."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _flag_type(tp: Any) -> tuple[type, bool]:
    """(scalar type for argparse, optional?) of a field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def add_config_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one `--flag` per dataclass field; the field's `doc` metadata is the help text."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        tp, _ = _flag_type(hints[field.name])
        flag = "--" + (prefix + field.name).replace("_", "-")
        help_text = field.metadata.get("doc", "")
        if tp is bool:
            group.add_argument(
                flag,
                dest=prefix + field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(
                flag,
                dest=prefix + field.name,
                type=tp,
                default=argparse.SUPPRESS,
                help=f"{help_text} (default: {field.default})",
            )


def config_from_args(cls: type[T], args: argparse.Namespace, prefix: str = "", **overrides: Any) -> T:
    """Build `cls` from the flags `add_config_args` added; unset flags keep their defaults."""
    values = {
        f.name: getattr(args, prefix + f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init and hasattr(args, prefix + f.name)
    }
    values.update(overrides)
    return cls(**values)


def doc(text: str) -> dict[str, str]:
    """Field metadata carrying its one-line doc (used for --help)."""
    return {"doc": text}
