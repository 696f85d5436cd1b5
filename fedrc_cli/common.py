"""What every subcommand shares: the console, params loading, and one-line errors."""

from __future__ import annotations

import dataclasses
import errno
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import torch
import typer
from rich.console import Console
from rich.markup import escape

from pipeline.config import TrainConfig, build_config, read_params
from pipeline.distributed import env_rank
from pipeline.errors import FedrcError

# Under torchrun, rank 0 alone prints (progress, errors): the ranks fail together, so one says it.
console = Console(quiet=env_rank() > 0)
error_console = Console(stderr=True, quiet=env_rank() > 0)

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
CHUNK_OPTION = "chunk_clients" in {f.name for f in dataclasses.fields(TrainConfig)}


def load_config(cls: Callable[..., T], params: Path | None, **overrides: Any) -> T:
    """Defaults ← the stage's params.yaml section ← the CLI options that were given."""
    return build_config(cls, read_params(params), overrides)  # type: ignore[arg-type]


def fail(message: str, code: int = 2) -> typer.Exit:
    error_console.print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


class Terminated(BaseException):
    """SIGTERM (a scheduler, `kill`) raised where the program is, as Ctrl-C raises
    KeyboardInterrupt; a BaseException so that `except Exception` in library code lets it by."""


INTERRUPT_CODES = {KeyboardInterrupt: 130, Terminated: 143}  # 128 + SIGINT / SIGTERM


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
    )


def out_of_memory(error: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(error, oom) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


@contextmanager
def user_errors() -> Iterator[None]:
    """Problems a user can fix become one red line on stderr; bugs keep their traceback.

    A FedrcError exits with 2, a full disk or GPU memory with 1, Ctrl-C with 130 and SIGTERM
    with 143: every stage writes through a temporary path, so what was there stays intact.
    """
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave SIGTERM alone
        previous = None
    try:
        yield
    except FedrcError as e:
        raise fail(str(e)) from None
    except (KeyboardInterrupt, Terminated) as e:
        name = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
        code = INTERRUPT_CODES[type(e)]
        raise fail(f"{name}; earlier outputs are left as they were", code) from None
    except Exception as e:
        if disk_full(e):
            where = getattr(e, "filename", None) or "an output file"
            raise fail(
                f"{where}: no space left on the disk; free some space or write to another "
                "disk with --out (earlier outputs are left as they were)",
                1,
            ) from None
        if out_of_memory(e):
            raise fail(
                "out of GPU memory; lower --batch-size"
                + (", --chunk-clients" if CHUNK_OPTION else "")
                + ", --clusters or the model size, or train on the CPU with --device cpu",
                1,
            ) from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def is_terminal() -> bool:
    return console.is_terminal and sys.stdout.isatty()
