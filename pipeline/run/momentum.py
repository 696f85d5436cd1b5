"""Each (client, model row)'s SGD momentum across rounds.

The authors' code keeps one optimizer per client and model, so a client's momentum carries over
from one round to its next (`persistent_momentum`, on in `profile: reference`). That is
clients × rows × trainable parameters of float32: 7.8 GB for 300 clients and three FMNIST CNNs,
more with larger models. Where the buffers live:

- on the GPU, when training runs there and they take at most `GPU_SHARE` of its free memory at
  the start: a local training then reads and writes its buffer without leaving the device. Kept
  in a memory-mapped file instead, every round moved the 7.8 GB to the host and back and made
  the page cache write them to disk: 4.3 s a paper-scale FedRC round on an H100 against 0.85 s
  without persistent momentum (benchmarks/gpu_check.sh's log, docs/gpu.md);
- otherwise in a memory-mapped file in the run folder (a sparse file: only buffers that exist
  take space), so that the page cache decides what stays in memory. A run whose buffers would
  not fit on that disk is refused with one line giving the size, before the first round.

Both are one (clients, rows, trainable) float32 tensor, so the rest of the code does not ask
which. A task gets a view of its buffer, which the executor copies when its training starts
(it never writes into it); the trained buffers are written back a chunk at a time, in one
indexed write when the next chunk's tasks ask for theirs or the round's training ends
(`flush`), not one copy per task (900 copies each way a paper-scale round on the H200).
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

from pipeline.common.errors import FedrcError
from pipeline.engine.task import LocalResult, LocalTask
from pipeline.places.communicate import Communicator

GB = 1e9
LIVE_FILE = ".momentum-rank{rank}.npy"  # a place's buffers while it trains, in the run folder
GPU_SHARE = 0.25  # of the GPU's free memory the buffers may take (the rest: training chunks)


def memory_for(device: torch.device, nbytes: int) -> torch.device | None:
    """Where buffers of `nbytes` live in memory: the CUDA device training runs on, when they take
    at most `GPU_SHARE` of its free memory; None (the live file) otherwise."""
    if device.type == "cuda" and nbytes <= GPU_SHARE * torch.cuda.mem_get_info(device)[0]:
        return device
    return None


class MomentumStore:
    """Disabled (nothing kept) unless `folder` is given. `device` is where training runs: a
    CUDA device keeps the buffers in its memory when they fit (`in_memory`)."""

    def __init__(
        self,
        folder: Path | None,
        clients: list[int],
        rows: int,
        size: int,
        comm: Communicator,
        device: torch.device | None = None,
    ) -> None:
        self.comm, self.rows, self.size = comm, rows, size
        self.clients = list(clients)  # the run's participants, in slot order
        self.slot = {client: i for i, client in enumerate(clients)}
        self.present = torch.zeros(len(clients), rows, dtype=torch.bool)  # buffers that exist
        self.path: Path | None = None
        self._buffers: torch.Tensor | None = None
        self._zero: torch.Tensor | None = None  # the buffer of a task seen the first time
        self._pending: list[tuple[int, int, torch.Tensor]] = []  # (slot, row, buffer) to write
        if folder is not None:
            self._mine = {c for c in clients if comm.owns(c)}
            self._open(folder, device or torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self._buffers is not None

    @property
    def in_memory(self) -> bool:
        """The buffers are a tensor in (GPU) memory, not the live file."""
        return self._buffers is not None and self.path is None

    def _open(self, folder: Path, device: torch.device) -> None:
        """The buffers on `device` if they fit there, else the live file; on the main place,
        room on the disk for a checkpoint's snapshot of every client's buffers."""
        each = self.rows * self.size * 4
        shape = (len(self.slot), self.rows, self.size)
        live = len(self.slot) * each  # every slot, as the tensor is indexed by slot
        if (memory := memory_for(device, live)) is not None:
            self._buffers = torch.zeros(shape, device=memory)
            live = 0
        need = (len(self._mine) * each if live else 0) + (
            len(self.slot) * each if self.comm.is_main else 0
        )
        free = shutil.disk_usage(folder).free
        if need > free:
            self._buffers = None
            raise FedrcError(
                f"train.persistent_momentum: {need / GB:.1f} GB of momentum buffers and their "
                f"checkpoint ({len(self.slot)} clients × {self.rows} models × {self.size:,} "
                f"parameters) do not fit in {folder} ({free / GB:.1f} GB free); free "
                "space, use fewer clients, or set persistent_momentum: false"
            )
        if live:
            self.path = folder / LIVE_FILE.format(rank=self.comm.rank)
            memmap = np.lib.format.open_memmap(self.path, "w+", np.float32, shape)
            self._buffers = torch.from_numpy(memmap)

    def attach(self, task: LocalTask, device: torch.device) -> None:
        """Give `task` its client's buffer for its row, to read only (zeros the first time):
        a view of the store's (the executor copies it to `device`)."""
        if self.enabled:
            self.flush()
            at = (self.slot[task.client], task.model)
            if self.present[at]:
                task.momentum = self._buffers[at]
            else:
                if self._zero is None:  # one for every such task: nobody writes into it
                    self._zero = torch.zeros(self.size, device=device)
                task.momentum = self._zero

    def keep(self, task: LocalTask, result: LocalResult) -> None:
        """The trained buffer of `task`, written with its chunk's (`flush`)."""
        if self.enabled and result.momentum is not None:
            at = (self.slot[task.client], task.model)
            self._pending.append((*at, result.momentum.detach()))
            self.present[at] = True

    def flush(self) -> None:
        """Write the buffers kept since the last flush: one indexed write in memory (a GPU's),
        a copy each into the live file's pages."""
        pending, self._pending = self._pending, []
        if not pending or self._buffers is None:
            return
        if not self.in_memory:
            for slot, row, buffer in pending:
                self._buffers[slot, row].copy_(buffer)
            return
        device = self._buffers.device
        slots = torch.tensor([p[0] for p in pending], device=device)
        rows = torch.tensor([p[1] for p in pending], device=device)
        self._buffers[slots, rows] = torch.stack([p[2].to(device) for p in pending])

    # --- checkpoints ----------------------------------------------------------------------
    def _own_rows(self) -> Iterator[tuple[int, Callable[[], torch.Tensor]]]:
        for client in sorted(self._mine):
            for row in range(self.rows):
                at = (self.slot[client], row)
                if self.present[at]:
                    key = at[0] * self.rows + row
                    yield key, lambda at=at: self._buffers[at].to("cpu", copy=True)

    def save(self, path: Path) -> torch.Tensor:
        """Every place's buffers into one .npy at `path` (written by the main place, renamed
        into place when complete); returns the (clients, rows) mask of buffers it holds."""
        self.flush()
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
                        self._buffers[at].copy_(buffer)
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
                self._buffers[at].copy_(row)
                self.present[at] = True

    def close(self) -> None:
        self._pending = []
        self._buffers = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
