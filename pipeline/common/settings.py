"""Typed settings: the checks every configuration dataclass shares.

A stage's configuration (`pipeline.config`) and each algorithm's or model's own settings are
frozen dataclasses. Values from YAML or the command line are checked against the field's type
(`coerce`), unknown keys are refused with the known ones (`build_settings`), and each class
checks its ranges in `validate()`, raising one `FedrcError` line that starts with the key.
A field made with `setting(default, "what it does")` carries the one-line description that
`fedrc info NAME` shows (`description`); a plain field has none and lists as well.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pipeline.common.errors import FedrcError, brief

S = TypeVar("S")
FLOAT32_MAX = 3.4028234663852886e38  # torch computes in float32: a larger number overflows


def require(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise FedrcError(f"{key}: expected {expected}, got {brief(value)}")


def did_you_mean(key: str, known: list[str]) -> str:
    """ " (did you mean 'lr'?)" for a near miss among `known`, else ""."""
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def float_problem(value: float) -> str | None:
    """What makes a float setting unusable (inf, nan, beyond float32), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if abs(value) > FLOAT32_MAX:
        return "a number of at most 3.4e38 in magnitude (torch's float32)"
    return None


def path_problem(value: str) -> str | None:
    """What makes a path setting unusable, or None: empty ("" is the current folder to some
    calls and nothing to others) or holding a control character (a NUL byte no system call
    takes; a newline breaks every one-line message that names the path)."""
    if value == "":
        return "a path, not an empty string"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "a path without control characters (NUL, newline, …)"
    return None


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check a YAML value against a dataclass field's type; ints are accepted where floats are."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(key, value, inner)
    if origin is list:
        require(isinstance(value, list), key, "a list", value)
        return [coerce(key, v, args[0]) for v in value]
    if annotation is bool:
        require(isinstance(value, bool), key, "true or false", value)
    elif annotation is int:
        require(isinstance(value, int) and not isinstance(value, bool), key, "an integer", value)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        require(ok, key, "a number", value)
        problem = float_problem(value)
        require(problem is None, key, problem or "", value)
        return float(value)
    elif annotation is str:
        require(isinstance(value, str), key, "a string", value)
    return value


def setting(default: Any, description: str) -> Any:
    """A settings field with its one-line description (for `fedrc info NAME`)."""
    return dataclasses.field(default=default, metadata={"help": description})


def description(item: dataclasses.Field) -> str:
    """A settings field's description; "" for a field made without one."""
    return item.metadata.get("help", "")


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class Settings:
    """Base of an algorithm's or a model's own settings (none by default).

    A subclass adds fields with their defaults (the paper's value where it gives one) and checks
    them in `validate`; `profiles` maps a `train.profile` name to the values it implies.
    """

    profiles: ClassVar[dict[str, dict[str, Any]]] = {}

    def validate(self) -> None:
        """Raise FedrcError("key: expected …") for a value out of range."""


def build_settings(cls: type[S], values: dict[str, Any], where: str) -> S:
    """`cls` from `values` (YAML or --set), each checked against its field's type; errors start
    with `where` (for example "train.fedrc" or "--set fedrc") and name the key."""
    types_ = field_types(cls)
    checked = {}
    for key, value in values.items():
        if key not in types_:
            known = ", ".join(types_) or "none"
            hint = did_you_mean(str(key), list(types_))
            raise FedrcError(f"{where}.{key}: unknown setting{hint} (known: {known})")
        checked[key] = coerce(f"{where}.{key}", value, types_[key])
    settings = cls(**checked)
    try:
        settings.validate()  # type: ignore[attr-defined]
    except FedrcError as e:
        raise FedrcError(f"{where}.{e}") from None
    return settings


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds; a negative one is refused by numpy
SEEDS = "an integer in [0, 2**32-1]"


def option(default: Any, help: str, default_factory: Any = None, path: bool = False) -> Any:
    """A field with the help text `fedrc <stage> --help` shows for its option; `path`: its
    value names a file or folder (checked by `path_problem`)."""
    metadata = {"help": help, "path": path}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def config_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
