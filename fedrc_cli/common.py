"""What every subcommand shares: the console, params loading, and one-line errors."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from fedrc_cli.failures import TRAIN_MEMORY, explained, shown
from pipeline.common.errors import FedrcError, FedrcWarning
from pipeline.config import TrainConfig, build_config, read_params
from pipeline.places.launch import env_rank, launched, leaving_with_error

PIPED_WIDTH = 1000  # columns when the output is a file or a pipe: whole lines, not 80-column cuts


class WholeLines(Console):
    """rich's Console, without a width when it writes to a file or a pipe: rich would use the
    terminal's width (or 80) and cut every longer line there (`COLUMNS` still rules)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or self._width is not None or "COLUMNS" in self._environ:
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


# Under torchrun, rank 0 alone prints (progress, errors): the ranks fail together, so one says it.
console = WholeLines(quiet=env_rank() > 0)
error_console = WholeLines(stderr=True, quiet=env_rank() > 0)

ParamsOption = Annotated[
    Path | None,
    typer.Option(
        "--params",
        help="YAML file with one section per stage; options given here override it. "
        "[default: ./params.yaml if present]",
        readable=False,  # fedrc names an unreadable file itself, on one line
    ),
]

T = TypeVar("T")
CHUNK_OPTION = "chunk_clients" in {f.name for f in dataclasses.fields(TrainConfig)}
GPU_MEMORY = (
    "lower --batch-size"
    + (", --chunk-clients" if CHUNK_OPTION else "")
    + ", --clusters or the model size, or train on the CPU with --device cpu"
)


def load_config(cls: Callable[..., T], params: Path | None, **overrides: Any) -> T:
    """Defaults ← the stage's params.yaml section ← the CLI options that were given."""
    return build_config(cls, read_params(params), overrides)  # type: ignore[arg-type]


MESSAGE_MAX = 1000  # characters: a message quoting a huge value stays readable, and one line


def fail(message: str, code: int = 2) -> typer.Exit:
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 1] + "…"
    line = " ".join(message.splitlines())  # one line, whatever a value in it held
    error_console.print(f"[bold red]Error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


class Terminated(BaseException):
    """SIGTERM (a scheduler, `kill`) raised where the program is, as Ctrl-C raises
    KeyboardInterrupt; a BaseException so that `except Exception` in library code lets it by."""


INTERRUPT_CODES = {KeyboardInterrupt: 130, Terminated: 143}  # 128 + SIGINT / SIGTERM


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def warning_line(message: str) -> None:
    line = f"[bold yellow]Warning:[/] {escape(message)}"
    error_console.print(line, highlight=False, soft_wrap=True)


@contextmanager
def fedrc_warnings() -> Iterator[None]:
    """A FedrcWarning raised inside is one yellow line on stderr, each time; other warnings
    are shown as Python shows them."""
    with warnings.catch_warnings():  # restores showwarning and the filters on the way out
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            if issubclass(category, FedrcWarning):
                warning_line(str(message))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.simplefilter("always", FedrcWarning)
        warnings.showwarning = show
        yield


@contextmanager
def _file_size_limit() -> Iterator[None]:
    """A write past the file-size limit (`ulimit -f`: EFBIG; Python ignores SIGXFSZ, which
    would kill it) is a FedrcError naming the file: the writes go through temporary paths, so
    nothing is half-written."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        where = shown(os.fsdecode(e.filename)) if e.filename else "an output file"
        raise FedrcError(
            f"{where}: file too large for the file-size limit (ulimit -f); raise the limit "
            "(earlier outputs are left as they were)"
        ) from None


@contextmanager
def user_errors(memory: str = "free some memory or use a larger machine") -> Iterator[None]:
    """Problems a user can fix become one red line on stderr; bugs keep their traceback;
    warnings a user should read are one yellow line (`fedrc_warnings`). `memory`: what to
    lower when memory runs out (`fedrc_cli.failures`).

    A FedrcError or a file-size limit exits with 2, a full disk or memory with 1, Ctrl-C
    with 130 and SIGTERM with 143: every stage writes through a temporary path, so what was
    there stays intact.
    """
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave SIGTERM alone
        previous = None
    try:
        with fedrc_warnings(), _file_size_limit():
            yield
    except FedrcError as e:
        if launched():  # every rank leaves with this error: see `leaving_with_error`
            leaving_with_error()
            previous = None
        raise fail(str(e)) from None
    except (KeyboardInterrupt, Terminated) as e:
        name = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
        during = f" {e}" if str(e) else ""  # where, when the code said (a plugin's import)
        code = INTERRUPT_CODES[type(e)]
        raise fail(f"{name}{during}; earlier outputs are left as they were", code) from None
    except Exception as e:
        found = explained(e, memory, GPU_MEMORY if memory == TRAIN_MEMORY else None)
        if found is None:
            raise
        raise fail(*found) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


# `.NAME.tmp-XXXXXXXX`: the longest name fedrc derives from an output's name (the temporary
# file or folder it writes beside it before renaming it into place)
DERIVED = len("..tmp-") + 8


def _name_max(path: Path) -> int:
    """The longest file name, in bytes, that the file system holding `path` takes."""
    node = path
    while not os.path.isdir(node) and node.parent != node:  # isdir never raises
        node = node.parent
    try:
        return os.pathconf(node, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def name_too_long(path: Path) -> str | None:
    """Why the names in `path` (and those fedrc derives from the last) are too long for the
    file system, or None."""
    limit = _name_max(path)
    for part in path.parts[:-1]:
        if len(os.fsencode(part)) > limit:
            return (
                f"a folder name in it is too long for the file system ({len(os.fsencode(part))} "
                f"bytes, at most {limit})"
            )
    size = len(os.fsencode(path.name))
    if size + DERIVED > limit:
        return (
            f"name too long for the file system ({size} bytes; at most {limit - DERIVED}, as "
            "fedrc writes a temporary file named after it)"
        )
    return None


def check_names(option: str, *paths: Path | str) -> None:
    """Refuse an output path whose names the file system cannot hold; touches nothing."""
    for path in paths:
        reason = name_too_long(Path(path))
        if reason is not None:
            raise FedrcError(f"{option}: {shown(path)}: {reason}")


# Why an output cannot be written, by errno; ENOSPC is not here: a full disk stays exit 1.
UNWRITABLE = {
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOENT: "cannot be created there (no such file or directory)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file is in the way where a folder is needed",
    errno.EISDIR: "a folder is in the way where a file is needed",
    errno.ENAMETOOLONG: "name too long for the file system",
}


def _unwritable(path: Path, folder: bool, probe: bool = True) -> str | None:
    """Why `path` (a folder if `folder`, else a file) cannot be written, or None.

    Creates nothing that stays: it walks up to the nearest existing ancestor, which must be a
    folder, not on a read-only mount and writable, and (with `probe`) creates and removes an
    empty folder there, which finds what os.access misses for root (/proc, /sys, read-only
    mounts). A read-only mount is named before permissions: os.access says no there too.
    """
    node = path
    while not os.path.lexists(node) and node.parent != node:
        node = node.parent
    if node == path:
        if folder and not path.is_dir():
            return "a file is in the way where a folder is needed"
        if not folder and path.is_dir():
            return "a folder is in the way where a file is needed"
        places = [path.parent, *([path] if folder else [])]  # beside it (temporary), inside it
    elif not node.is_dir():
        return f"{node} is a file, not a folder"
    else:
        places = [node]
    for place in places:
        if os.statvfs(place).f_flag & os.ST_RDONLY:
            return "read-only file system"
        if probe:
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".fedrc-probe-", dir=place))
            except OSError as e:
                if e.errno in UNWRITABLE:
                    return UNWRITABLE[e.errno]
                # anything else (a full disk) is left to the write itself
        if not os.access(place, os.W_OK | os.X_OK):
            return "permission denied"
    return None


def writable_output(option: str, path: Path | str, folder: bool = True) -> None:
    """Refuse, before any work, an output path that cannot be written; writes nothing."""
    check_names(option, path)
    reason = _unwritable(Path(path), folder)
    if reason is not None:
        raise FedrcError(f"{option}: {path}: {reason}")


def _concerned(error: OSError, paths: tuple[Path | str, ...]) -> Path | str | None:
    """Which of `paths` `error` is about writing: the path, a folder above it, its temporary
    sibling, or (unless the error is a missing file) something inside it; None if none is."""
    names = [n for n in (error.filename, error.filename2) if isinstance(n, str | bytes)]
    if not names:
        return paths[0]  # raised by a write that named no file
    for name in names:
        failed = Path(os.path.abspath(os.fsdecode(name)))
        for path in paths:
            target = Path(os.path.abspath(path))
            if failed == target or failed in target.parents:
                return path
            if failed.parent == target.parent and failed.name.startswith(f".{target.name}."):
                return path
            if error.errno != errno.ENOENT and target in failed.parents:
                return path
    return None


@contextmanager
def writing(
    option: str, *paths: Path | str, folder: bool = True, check: bool = True
) -> Iterator[None]:
    """The outputs `option` names: checked before the work (`writable_output`) if `check`, and
    an error that only shows when writing them (a read-only mount) is one line, exit 2.

    The stages write through temporary paths, so a refused write leaves the old output as it
    was; folders made for the outputs are removed again, while empty, whatever stopped the
    command (a full disk, Ctrl-C).
    """
    for path in paths:
        check_names(option, path)  # even unchecked: a long name breaks every check
        if check:
            writable_output(option, path, folder)
    new = [  # the folders a write may create, deepest first: removed again if it is refused
        p
        for path in map(Path, paths)
        for p in ([path] if folder else []) + list(path.parents)
        if not os.path.lexists(p)
    ]
    try:
        yield
    except OSError as e:
        _remove_empty(new)
        path = _concerned(e, paths) if e.errno in UNWRITABLE else None
        if path is None:
            raise
        # the errno says a read-only mount for sure; os.access would call it permission denied
        found = None if e.errno == errno.EROFS else _unwritable(Path(path), folder, probe=False)
        raise FedrcError(f"{option}: {path}: {found or UNWRITABLE[e.errno]}") from None
    except BaseException:
        _remove_empty(new)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) while they are empty: what was written there stays."""
    for created in folders:
        try:
            created.rmdir()
        except OSError:
            break


def give_back_outputs() -> None:
    """Under `dvc repro` or `dvc exp run`, put back the stage's outputs that DVC removed before
    this failed command ran (`pipeline.common.dvc_stage`), and say so on one line."""
    from pipeline.common.dvc_stage import restore_removed_outputs, stage_root

    if stage_root() is None:
        return
    try:
        restored = restore_removed_outputs()
    except Exception as e:  # DVC's errors: a cache without the files (a clone not pulled)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        warning_line(
            f"DVC removed this stage's outputs before it ran, and they could not be checked "
            f"out again ({first}); `dvc checkout {os.environ.get('DVC_STAGE', '')}` may"
        )
        return
    if restored:
        error_console.print(
            f"DVC's last outputs of this stage are back, as dvc.lock records them: "
            f"{', '.join(restored)}",
            highlight=False,
            soft_wrap=True,
        )


def is_terminal() -> bool:
    return console.is_terminal and sys.stdout.isatty()
