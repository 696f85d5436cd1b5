"""Algorithms, models and datasets by name: fedrc's own and those of installed packages.

A package adds one with an entry point in its pyproject.toml (group `fedrc.algorithms`,
`fedrc.models` or `fedrc.datasets`):

    [project.entry-points."fedrc.algorithms"]
    my-method = "my_package.my_method:MyMethod"

A module that is not installed is named `module.path:Name` instead (imported from the current
folder or PYTHONPATH), or a file `path/to/file.py:Name`. A plugin is imported only when it is
asked for or listed, so one that fails to import costs one line where it is named and nothing
elsewhere.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError


@dataclass(frozen=True)
class Entry:
    """One row of `fedrc info`: a component's card, where it comes from, or why it did not
    load."""

    name: str
    origin: str  # "built-in", or "<distribution> <version>"
    card: Any = None  # what `Registry.card` gives
    error: str | None = None


def _origin(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an installed package"


def module_name(source: str) -> str:
    """The name in sys.modules of a plugin's module: `module.path` itself, or for a file
    `path/file.py` a name of its own (the file's stem and a hash of its absolute path)."""
    if not source.endswith(".py"):
        return source
    where = hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:12]
    return f"fedrc_plugin_{Path(source).stem.replace('.', '_')}_{where}"


def _import_module(source: str) -> Any:
    """`module.path` imported, or the file `path/file.py` loaded as a module (once)."""
    name = module_name(source)
    if name == source or name in sys.modules:
        return importlib.import_module(name)
    if not Path(source).is_file():
        raise ModuleNotFoundError(f"no file {source}")
    spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # a dataclass in it looks itself up there
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(target: str, what: str) -> Any:
    """`module.path:Name` or `path/file.py:Name` → the object; any failure is one FedrcError
    naming `what`."""
    source, _, attribute = target.partition(":")
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `fedrc` as a console script lacks the cwd
    try:
        obj: Any = _import_module(source)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except KeyboardInterrupt:  # Ctrl-C, or the plugin raised it: stop, saying where
        raise KeyboardInterrupt(f"while importing {what}") from None
    except (Exception, SystemExit) as e:  # a plugin's import may raise, or exit: say which
        if isinstance(e, SystemExit):
            reason = f"it called sys.exit({e.code!r}) on import"
        else:
            first = str(e).splitlines()[0] if str(e) else ""
            reason = f"{type(e).__name__}: {first}".rstrip(": ")
        raise FedrcError(f"{what} failed to load ({reason[:200]})") from None
    return obj


def _itself(card: Any) -> Any:
    return card


class Registry:
    """The components of one kind: built-in ones by name, then entry points, then `module:Name`.

    `builtins()` maps each built-in name to its card: what `fedrc info` shows of it (its paper
    or summary, its settings), read without importing torch; `load(card)` gives the component
    a run uses (by default the card itself, as a model's or a dataset's spec is both).
    `check(component)` returns an error text when a plugin's object is not usable as this
    kind (not an Algorithm subclass, …), else None.
    """

    def __init__(
        self,
        kind: str,
        option: str,
        builtins: Callable[[], dict[str, Any]],
        check: Callable[[Any], str | None],
        load: Callable[[Any], Any] = _itself,
    ):
        self.kind = kind
        self.option = option
        self.group = f"fedrc.{kind}s"
        self._builtins = builtins
        self._check = check
        self._load_builtin = load

    def _points(self) -> dict[str, metadata.EntryPoint]:
        return {p.name: p for p in metadata.entry_points(group=self.group)}

    def _load(self, target: str, what: str) -> Any:
        component = _import(target, what)
        problem = self._check(component)
        if problem is not None:
            raise FedrcError(f"{what}: {problem}")
        return component

    def get(self, name: str, option: str | None = None) -> Any:
        """The component called `name`; errors name `option` (default: the CLI option)."""
        option = option or self.option
        builtins = self._builtins()
        if name in builtins:
            return self._load_builtin(builtins[name])
        points = self._points()
        if name in points:
            point = points[name]
            where = f"entry point {self.group}: {name} = {point.value}, from {_origin(point)}"
            return self._load(point.value, f"{option}: plugin {name!r} ({where})")
        if ":" in name:
            return self._load(name, f"{option}: {name}")
        known = ", ".join([*builtins, *points])
        raise FedrcError(
            f"{option}: unknown {self.kind} {name!r} (known: {known}; or a plugin's "
            "module.path:Name)"
        )

    def module(self, name: str) -> str | None:
        """The module in sys.modules that the plugin `name` comes from (`get` imports it); None
        for a built-in, whose code is fedrc's."""
        if name in self._builtins():
            return None
        points = self._points()
        target = points[name].value if name in points else name
        return module_name(target.partition(":")[0])

    def card(self, name: str) -> Any:
        """What `fedrc info NAME` shows: a built-in's card, without importing it; a plugin's
        component, imported (`get`)."""
        builtins = self._builtins()
        return builtins[name] if name in builtins else self.get(name)

    def names(self) -> list[str]:
        """Built-in names, then the installed plugins' (without importing them)."""
        return [*self._builtins(), *(n for n in self._points() if n not in self._builtins())]

    def entries(self) -> Iterator[Entry]:
        """Every component's card, importing each plugin (not the built-ins); a plugin that
        fails gives its error line."""
        builtins = self._builtins()
        for name, card in builtins.items():
            yield Entry(name, "built-in", card)
        for name, point in self._points().items():
            if name in builtins:
                yield Entry(name, _origin(point), error="name taken by a built-in; not used")
                continue
            try:
                yield Entry(name, _origin(point), self.get(name))
            except FedrcError as e:
                yield Entry(name, _origin(point), error=str(e))
