"""Each (client, model row)'s SGD momentum across rounds, kept in a memory-mapped file.

The authors' code keeps one optimizer per client and model, so a client's momentum carries over
from one round to its next (`persistent_momentum`, on in `profile: reference`). That is
clients × rows × trainable parameters of float32: 7.8 GB for 300 clients and three FMNIST CNNs,
more with larger models, so it lives on disk in the run folder (a sparse file: only buffers
that exist take space) and the page cache decides what stays in memory. A run whose buffers
would not fit on that disk is refused with one line giving the size, before the first round.

Under torchrun every rank keeps the buffers of its own clients (`Communicator.owns`); a
checkpoint gathers them into one snapshot file that any number of ranks can resume from.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from pipeline.communicate import Communicator
from pipeline.engine.task import LocalResult, LocalTask
from pipeline.errors import FedrcError

GB = 1e9
LIVE_FILE = ".momentum-rank{rank}.npy"  # a place's buffers while it trains, in the run folder


class MomentumStore:
    """Disabled (no file, nothing kept) unless `folder` is given."""

    def __init__(
        self,
        folder: Path | None,
        clients: list[int],
        rows: int,
        size: int,
        comm: Communicator,
    ) -> None:
        self.comm, self.rows, self.size = comm, rows, size
        self.clients = list(clients)  # the run's participants, in slot order
        self.slot = {client: i for i, client in enumerate(clients)}
        self.present = torch.zeros(len(clients), rows, dtype=torch.bool)  # buffers that exist
        self.path: Path | None = None
        self._buffers: np.memmap | None = None
        if folder is not None:
            mine = [c for c in clients if comm.owns(c)]
            self._open(folder / LIVE_FILE.format(rank=comm.rank), mine)

    @property
    def enabled(self) -> bool:
        return self._buffers is not None

    def _open(self, path: Path, mine: list[int]) -> None:
        """The live file (sparse: this place's clients' rows only take space) and, on the main
        place, room for a checkpoint's snapshot of every client's buffers."""
        each = self.rows * self.size * 4
        need = len(mine) * each + (len(self.slot) * each if self.comm.is_main else 0)
        free = shutil.disk_usage(path.parent).free
        if need > free:
            raise FedrcError(
                f"train.persistent_momentum: {need / GB:.1f} GB of momentum buffers and their "
                f"checkpoint ({len(self.slot)} clients × {self.rows} models × {self.size:,} "
                f"parameters) do not fit in {path.parent} ({free / GB:.1f} GB free); free "
                "space, use fewer clients, or set persistent_momentum: false"
            )
        self.path = path
        shape = (len(self.slot), self.rows, self.size)
        self._buffers = np.lib.format.open_memmap(path, "w+", np.float32, shape)
        self._mine = set(mine)

    def attach(self, task: LocalTask, device: torch.device) -> None:
        """Give `task` its client's buffer for its row (zeros the first time)."""
        if self.enabled:
            at = (self.slot[task.client], task.model)
            if self.present[at]:
                task.momentum = torch.from_numpy(np.array(self._buffers[at])).to(device)
            else:
                task.momentum = torch.zeros(self.size, device=device)

    def keep(self, task: LocalTask, result: LocalResult) -> None:
        if self.enabled and result.momentum is not None:
            at = (self.slot[task.client], task.model)
            self._buffers[at] = result.momentum.detach().to("cpu", torch.float32).numpy()
            self.present[at] = True

    # --- checkpoints ----------------------------------------------------------------------
    def _own_rows(self) -> Iterator[tuple[int, Callable[[], torch.Tensor]]]:
        for client in sorted(self._mine):
            for row in range(self.rows):
                at = (self.slot[client], row)
                if self.present[at]:
                    key = at[0] * self.rows + row
                    yield key, lambda at=at: torch.from_numpy(np.array(self._buffers[at]))

    def save(self, path: Path) -> torch.Tensor:
        """Every place's buffers into one .npy at `path` (written by the main place, renamed
        into place when complete); returns the (clients, rows) mask of buffers it holds."""
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        snapshot = None
        if self.comm.is_main:
            shape = (len(self.slot), self.rows, self.size)
            snapshot = np.lib.format.open_memmap(tmp, "w+", np.float32, shape)
        present = torch.zeros_like(self.present)
        try:
            for key, row in self.comm.all_rows(self._own_rows(), self.size):
                at = divmod(key, self.rows)
                present[at] = True
                if snapshot is not None:
                    snapshot[at] = row.numpy()
            if snapshot is not None:
                snapshot.flush()
                del snapshot
                os.replace(tmp, path)
        finally:
            if self.comm.is_main:
                tmp.unlink(missing_ok=True)
        return present

    def load(self, path: Path | None, present: torch.Tensor | None, legacy: dict | None) -> None:
        """Take this place's buffers from a snapshot (`path`, `present`) or, for checkpoints
        of fedrc's first format, from the {client: {row: buffer}} dict they held."""
        if not self.enabled:
            return
        if legacy is not None:
            for client, rows in legacy.items():
                for row, buffer in rows.items():
                    if client in self._mine:
                        at = (self.slot[client], row)
                        self._buffers[at] = buffer.to(torch.float32).numpy()
                        self.present[at] = True
            return
        source = np.load(path, mmap_mode="r") if self.comm.is_main else None
        for key in present.flatten().nonzero().flatten().tolist():
            at = divmod(key, self.rows)
            row = self.comm.broadcast(
                torch.from_numpy(np.array(source[at])) if source is not None else None,
                (self.size,),
            )
            if self.clients[at[0]] in self._mine:
                self._buffers[at] = row.numpy()
                self.present[at] = True

    def close(self) -> None:
        if self.path is not None:
            self._buffers = None
            self.path.unlink(missing_ok=True)
