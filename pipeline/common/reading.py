"""Reading a file a user can hand fedrc: every way it can fail is one line naming it.

A params file, a manifest, a run's JSON files: each may be missing, a folder, a device or a
pipe (`/dev/null`, a FIFO, which would block a read), unreadable (its mode, another user's),
not UTF-8, or JSON nested deeper than Python's parser follows (a RecursionError).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.common.errors import FedrcError

REASONS = {  # why a file cannot be opened, by errno
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "a folder, not a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EIO: "input/output error (a failing disk?)",
    errno.ENXIO: "not a regular file",
}


def unreadable(path: Path | str) -> str | None:
    """Why `path` cannot be read as a regular file, or None; opens nothing (a FIFO would
    block)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "not found"
    except OSError as e:
        return REASONS.get(e.errno or 0, e.strerror or str(e))
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a device, a pipe or a socket)"
    return None


def opened(path: Path) -> BinaryIO:
    """The file opened for reading in binary, or a FedrcError "<path>: <why>"."""
    reason = unreadable(path)
    if reason is None:
        try:
            return path.open("rb")
        except OSError as e:
            reason = REASONS.get(e.errno or 0, e.strerror or str(e))
    raise FedrcError(f"{path}: {reason}")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, or a FedrcError "<path>: <why>"."""
    with opened(path) as f:
        try:
            return f.read()
        except OSError as e:
            raise FedrcError(f"{path}: {REASONS.get(e.errno or 0, e.strerror or str(e))}") from None


def read_text(path: Path) -> str:
    """The file as UTF-8 text, or a FedrcError naming it (`read_bytes`, or not UTF-8)."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FedrcError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save it "
            "as UTF-8"
        ) from None


def parse_json(text: str | bytes) -> Any:
    """`json.loads`, with nesting too deep for the parser a JSONDecodeError like any other
    malformed JSON (instead of a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
