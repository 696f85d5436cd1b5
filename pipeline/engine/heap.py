"""Keep freed model-sized buffers in the process's heap while local trainings run on a CPU.

Every local training allocates and frees buffers the size of the model: its gradients, its
SGD momentum, its flat result (8.7 MB each for the FMNIST CNN). glibc's malloc gives a freed
block at the top of the heap back to the kernel once the free space there passes its trim
threshold, and serves blocks above its mmap threshold with fresh pages, so each new buffer is
faulted in again page by page: about 1,700 page faults, 3–4 ms of system time, for a one-step
local training of a client with 18 samples, as long as the training itself (measured with
`benchmarks/many_clients.py`). Fixing both thresholds keeps such buffers in the heap for the
next training; blocks above `MMAP_THRESHOLD` (the dataset, the logits of a whole round) are
still mapped and unmapped as before. Numbers do not change, only where memory comes from.

Other C libraries (macOS, musl) keep their own policy: `keep_freed_buffers` does nothing there.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit systems)
TRIM_THRESHOLD = 64 << 20  # free space the heap may keep at its top: a few model-sized buffers


def keep_freed_buffers() -> bool:
    """Set glibc's trim and mmap thresholds (once is enough; again is harmless). Returns
    whether both were set."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a glibc system
        return False
    if not glibc.startswith("glibc"):
        return False
    libc = ctypes.CDLL(None)  # the symbols already loaded: glibc's malloc among them
    trim = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    mmap = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(trim and mmap)
