"""What every subcommand shares: the console, params loading, and one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pipeline.config import build_config, read_params
from pipeline.errors import FedrcError

console = Console()
error_console = Console(stderr=True)

ParamsOption = Annotated[
    Path | None,
    typer.Option(
        "--params",
        help="YAML file with one section per stage; options given here override it. "
        "[default: ./params.yaml if present]",
        dir_okay=False,
    ),
]

T = TypeVar("T")


def load_config(cls: Callable[..., T], params: Path | None, **overrides: Any) -> T:
    """Defaults ← the stage's params.yaml section ← the CLI options that were given."""
    return build_config(cls, read_params(params), overrides)  # type: ignore[arg-type]


def fail(message: str, code: int = 2) -> typer.Exit:
    error_console.print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a FedrcError into one red line on stderr and exit code 2; bugs keep their traceback."""
    try:
        yield
    except FedrcError as e:
        raise fail(str(e)) from None


def split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def is_terminal() -> bool:
    return console.is_terminal and sys.stdout.isatty()
