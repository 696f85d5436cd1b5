"""Per-client vectors that a rule needs all at once, kept on disk instead of in memory.

A few aggregation rules need every sampled client's trained model (or update) together: CFL's
split test compares all members' updates, FeSEM-CAM runs K-means over the clients' models,
FedSoft keeps every client's personal model. Holding them in memory costs clients × model
(8.7 MB each for the FMNIST CNN: 2.6 GB at 300 clients). A `RowStore` appends each vector to a
scratch file as it arrives and hands them back through a read-only memory map, so the resident
memory stays one model; the operating system's page cache decides what stays in RAM.

The scratch file lives in the system's temporary folder (set `TMPDIR` to move it) and is
deleted when the store is closed or garbage collected.

The file is for when memory is short: a round's store keeps its rows in the host's memory when
one row for every client takes at most a quarter of the free memory there (`client_rows`),
which saves each row's trip through the file. A rule whose rows end in memory anyway, as its
state on the device that trains (FedSoft's personal models), keeps them on that device
(`RowStore(width, device)`), which also saves their trip through the host on a GPU.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import numpy as np
import torch

BLOCK = 16  # rows read per block when scanning (16 × 8.7 MB for the FMNIST CNN)
MEMORY_SHARE = 0.25  # of the free memory that rows kept in memory may take (`room_for`)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for this process on `device` (the host's memory is shared by the processes
    torchrun started on it), or None where it is not known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            free = next(
                int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
            )
    except (OSError, StopIteration, ValueError):
        return None
    return free // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def room_for(nbytes: int, device: torch.device) -> torch.device | None:
    """`device` when `nbytes` of rows take at most MEMORY_SHARE of its free memory there, else
    None (keep them in a file)."""
    free = available_memory(device)
    return device if free is not None and nbytes <= MEMORY_SHARE * free else None


def client_rows(width: int, clients: int) -> RowStore:
    """A store for a round's rows, one per client at most: in the host's memory when all of
    them fit there (`room_for`), else in a file; either way its rows come back on the CPU."""
    return RowStore(width, room_for(4 * width * clients, torch.device("cpu")))


class RowStore:
    """Float32 vectors of one length, each under an integer key (a client id), in arrival order.

    `stored_keys()` and `get(key)` read them back; `blocks()` scans them a few at a time, and
    `items()` hands each one over. In a file, or in memory on `device` when one is given.
    """

    def __init__(self, width: int, device: torch.device | None = None) -> None:
        self.width = width
        self.device = device
        self._kept: dict[int, torch.Tensor] = {}  # the rows, when in memory
        self._file = None
        if device is None:
            self._file = tempfile.TemporaryFile(prefix="fedrc-rows-")  # noqa: SIM115 (close)
        self._index: dict[int, int] = {}
        self._map: np.memmap | None = None

    def __len__(self) -> int:
        return len(self._kept) if self._file is None else len(self._index)

    def add(self, key: int, row: torch.Tensor) -> None:
        """Append `row` under `key` (a key already present is replaced by the new row)."""
        if tuple(row.shape) != (self.width,):
            raise ValueError(f"row of shape {tuple(row.shape)}, store holds ({self.width},)")
        if self._file is None:
            self._kept[key] = row.detach().to(self.device, torch.float32, copy=True)
            return
        values = row.detach().to("cpu", torch.float32).numpy()
        end = self._file.seek(0, 2)
        self._file.write(values.tobytes())
        self._index[key] = end // (4 * self.width)
        self._map = None

    def stored_keys(self) -> list[int]:
        return sorted(self._kept if self._file is None else self._index)

    def _rows(self) -> np.memmap:
        if self._map is None:
            self._file.flush()
            count = self._file.seek(0, 2) // (4 * self.width)
            self._map = np.memmap(self._file, np.float32, "r", shape=(count, self.width))
        return self._map

    def get(self, key: int) -> torch.Tensor:
        """The row stored under `key`, as a float32 tensor in memory (a copy)."""
        if self._file is None:
            return self._kept[key].clone()
        return torch.from_numpy(np.array(self._rows()[self._index[key]]))

    def blocks(self, keys: list[int] | None = None) -> Iterator[tuple[list[int], torch.Tensor]]:
        """(keys, (n, width) tensor) for `keys` (default: all, sorted), BLOCK rows at a time."""
        keys = self.stored_keys() if keys is None else keys
        for start in range(0, len(keys), BLOCK):
            part = keys[start : start + BLOCK]
            if self._file is None:
                yield part, torch.stack([self._kept[k] for k in part])
            else:
                rows = self._rows()
                yield part, torch.from_numpy(np.array(rows[[self._index[k] for k in part]]))

    def items(self) -> Iterator[tuple[int, torch.Tensor]]:
        """Each (key, row) in key order, the row the caller's own: no copy of a row kept in
        memory (the store lets go of it), one read of a row in the file."""
        for key in self.stored_keys():
            yield key, self._kept.pop(key) if self._file is None else self.get(key)

    def close(self) -> None:
        self._map = None
        self._kept = {}
        if self._file is not None:
            self._file.close()
