"""What an exception that escaped a command means to its user: one line and an exit code.

Problems of the machine rather than of fedrc: a full disk, too little memory (for a tensor, or
for torch's own libraries under a virtual-memory limit), a file that exists but cannot be read
or written (its mode, another user's, a folder where a file should be). Each is named with the
file it concerns when the error says which; a bug keeps its traceback (`explained` is None).
"""

from __future__ import annotations

import errno
import os
import sys

from pipeline.common.reading import REASONS

TRAIN_MEMORY = "lower --clusters, --batch-size or the model size (--model)"
# torch's libraries mapped under `ulimit -v`: the loader's words, in ImportError or OSError
NO_ADDRESS_SPACE = ("failed to map segment", "cannot allocate memory")


def shown(path: object) -> str:
    """`path` for a one-line message: a very long one loses its middle."""
    text = os.fsdecode(path) if isinstance(path, str | bytes) else str(path)
    return text if len(text) <= 80 else f"{text[:38]}…{text[-38:]}"


def disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
    )


def out_of_memory(error: BaseException) -> bool:
    """GPU memory: torch's own error (if a command imported torch), or its older RuntimeError."""
    torch = sys.modules.get("torch")  # imported here, every command would pay for it
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(
        getattr(torch, "cuda", None), "OutOfMemoryError", None
    )
    return (oom is not None and isinstance(error, oom)) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


def out_of_ram(error: BaseException) -> bool:
    """The host's memory: Python's MemoryError, or torch's allocator refusing a tensor."""
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


def no_room_for_libraries(error: BaseException) -> bool:
    """A shared library (torch's) that the loader could not map: a virtual-memory limit."""
    return isinstance(error, ImportError | OSError) and any(
        words in str(error).lower() for words in NO_ADDRESS_SPACE
    )


def explained(error: BaseException, memory: str, gpu: str | None) -> tuple[str, int] | None:
    """The line and exit code for `error`, or None for a bug. `memory` says what to lower when
    the host's memory runs out, `gpu` when the GPU's does (None: the command uses no GPU)."""
    if isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG:  # an input's name
        where = shown(error.filename) if error.filename else "a path"
        return f"{where}: name too long for the file system", 2
    if disk_full(error):
        where = getattr(error, "filename", None) or "an output file"
        return (
            f"{where}: no space left on the disk; free some space or write to another disk "
            "with --out (earlier outputs are left as they were)",
            1,
        )
    if no_room_for_libraries(error):
        return (
            "out of memory loading torch's libraries (a virtual-memory limit, `ulimit -v`, "
            "below about 4 GB?); raise the limit",
            1,
        )
    if out_of_memory(error):
        return f"out of GPU memory; {gpu or memory}", 1
    if out_of_ram(error):
        return f"out of memory; {memory}", 1
    if isinstance(error, OSError) and error.filename and error.errno in REASONS:
        return f"{shown(error.filename)}: {REASONS[error.errno]}", 2
    return None
