"""Per-client vectors that a rule needs all at once, kept on disk instead of in memory.

A few aggregation rules need every sampled client's trained model (or update) together: CFL's
split test compares all members' updates, FeSEM-CAM runs K-means over the clients' models,
FedSoft keeps every client's personal model. Holding them in memory costs clients × model
(8.7 MB each for the FMNIST CNN: 2.6 GB at 300 clients). A `RowStore` appends each vector to a
scratch file as it arrives and hands them back through a read-only memory map, so the resident
memory stays one model; the operating system's page cache decides what stays in RAM.

The scratch file lives in the system's temporary folder (set `TMPDIR` to move it) and is
deleted when the store is closed or garbage collected.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np
import torch

BLOCK = 16  # rows read per block when scanning (16 × 8.7 MB for the FMNIST CNN)


class RowStore:
    """Float32 vectors of one length, each under an integer key (a client id), in arrival order.

    `stored_keys()` and `get(key)` read them back; `blocks()` scans them a few at a time.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self._file = tempfile.TemporaryFile(prefix="fedrc-rows-")  # noqa: SIM115 (closed by close)
        self._index: dict[int, int] = {}
        self._map: np.memmap | None = None

    def __len__(self) -> int:
        return len(self._index)

    def add(self, key: int, row: torch.Tensor) -> None:
        """Append `row` under `key` (a key already present is replaced by the new row)."""
        values = row.detach().to("cpu", torch.float32).numpy()
        if values.shape != (self.width,):
            raise ValueError(f"row of shape {values.shape}, store holds ({self.width},)")
        end = self._file.seek(0, 2)
        self._file.write(values.tobytes())
        self._index[key] = end // (4 * self.width)
        self._map = None

    def stored_keys(self) -> list[int]:
        return sorted(self._index)

    def _rows(self) -> np.memmap:
        if self._map is None:
            self._file.flush()
            count = self._file.seek(0, 2) // (4 * self.width)
            self._map = np.memmap(self._file, np.float32, "r", shape=(count, self.width))
        return self._map

    def get(self, key: int) -> torch.Tensor:
        """The row stored under `key`, as a float32 tensor in memory (a copy)."""
        return torch.from_numpy(np.array(self._rows()[self._index[key]]))

    def blocks(self, keys: list[int] | None = None) -> Iterator[tuple[list[int], torch.Tensor]]:
        """(keys, (n, width) tensor) for `keys` (default: all, sorted), BLOCK rows at a time."""
        keys = self.stored_keys() if keys is None else keys
        rows = self._rows()
        for start in range(0, len(keys), BLOCK):
            part = keys[start : start + BLOCK]
            yield part, torch.from_numpy(np.array(rows[[self._index[k] for k in part]]))

    def close(self) -> None:
        self._map = None
        self._file.close()
