"""A command's options made from its configuration dataclass: one source for names, types,
help and defaults.

Each field becomes `--field-name` (a bool `--x/--no-x`), with the field's help and, in `--help`,
the default that applies here: params.yaml's value when the file in the current folder sets it,
else the built-in one, each labelled with where it came from.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.common.errors import FedrcError
from pipeline.common.settings import field_types
from pipeline.config import read_params
from pipeline.config import section as section_of

PARAMS = Path("params.yaml")


def params_section(name: str) -> dict[str, Any]:
    """The section of ./params.yaml, or {} when there is none or it cannot be read: this runs
    at import, for `--help`'s defaults, so a broken file must not break `fedrc --version` or
    `fedrc info`; the command that reads it names the problem."""
    try:
        return section_of(read_params(None), name)
    except FedrcError:
        return {}


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _option_type(annotation: Any) -> Any:
    """The CLI type: X for `X | None`; a list is given comma-separated, as one string, and so
    is a field of any type (`partition.drift`: a name on the command line)."""
    if _list_item(annotation) is not None or annotation is Any:
        return str
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def dataclass_options(
    cls: type, section: str, skip: tuple[str, ...] = (), names: dict[str, str] | None = None
) -> list[inspect.Parameter]:
    """Keyword parameters for a Typer command, one per field of `cls` not in `skip`; each
    defaults to None (not given). `names` renames an option (field → `--flag`, or for a bool
    `--yes/--no`). A class with `GROUPS` (title → field names) shows each group in its own
    panel of `--help`."""
    from_file = params_section(section)
    panels = {name: title for title, names in getattr(cls, "GROUPS", {}).items() for name in names}
    types_ = field_types(cls)
    parameters = []
    for item in dataclasses.fields(cls):
        if item.name in skip:
            continue
        given = item.name in from_file
        value = from_file[item.name] if given else getattr(cls(), item.name)
        where = f"from {PARAMS.name}" if given else "built-in"
        kind = _option_type(types_[item.name])
        flag = (names or {}).get(item.name, "--" + item.name.replace("_", "-"))
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool and "/" not in flag else [flag]
        option = typer.Option(
            *decls,
            help=item.metadata.get("help", ""),
            show_default=f"{_shown(value)} {where}",
            rich_help_panel=panels.get(item.name),
        )
        annotation = Annotated[kind | None, option]  # type: ignore[operator]
        parameters.append(
            inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation=annotation)
        )  # fmt: skip
    return parameters


def _list_item(annotation: Any) -> type | None:
    """T for a `list[T]` or `list[T] | None` field, else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is list:
            return typing.get_args(candidate)[0]
    return None


def comma_lists(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The CLI's comma-separated values of `cls`'s list fields as lists ("1,2" → [1.0, 2.0])."""
    values = dict(options)
    for name, annotation in field_types(cls).items():
        item = _list_item(annotation)
        if item is None or values.get(name) is None:
            continue
        parts = [p.strip() for p in str(values[name]).split(",") if p.strip()]
        try:
            values[name] = [item(p) for p in parts]
        except ValueError:
            flag, what = "--" + name.replace("_", "-"), "numbers" if item is float else "values"
            raise FedrcError(
                f"{flag}: expected comma-separated {what}, got {values[name]!r}"
            ) from None
    return values


def with_options(command: Callable[..., Any], extra: list[inspect.Parameter]) -> Callable[..., Any]:
    """`command`'s own keyword parameters, then `extra`: the signature Typer reads."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + extra
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command
