"""What torchrun's environment says about this process, read without importing torch: the CLI
needs the rank before any command runs (only rank 0 prints), and `pipeline.places.distributed` the
rest."""

from __future__ import annotations

import os
import signal
import threading


def world_size() -> int:
    """The number of processes torchrun started (1 when run without torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def launched() -> bool:
    """True in a process that torchrun started with more than one process in the job."""
    return world_size() > 1


def env_rank() -> int:
    """This process's rank from the environment (0 without torchrun)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def leaving_with_error() -> None:
    """This rank exits with the error every rank agreed on: ignore SIGTERM from now on.

    The ranks leave at nearly the same moment, yet torchrun's agent stops the others (SIGTERM)
    as soon as it sees the first one exit; a rank still on its way out would then report 143
    in place of the agreed error's 2. A process already leaving has nothing left to stop."""
    if launched() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
