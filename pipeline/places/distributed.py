"""torch.distributed for one experiment spread over several processes, GPUs and machines.

`torchrun` starts one process per GPU (or per CPU worker) and sets WORLD_SIZE, RANK and
LOCAL_RANK; `Group.start` reads them and joins the process group: NCCL when the ranks train on
CUDA (rank r on `cuda:LOCAL_RANK`), gloo on the CPU. Without torchrun (no WORLD_SIZE, or 1)
the round loop runs with the trivial `pipeline.places.communicate.Communicator`.

`Group` is the `Communicator` of a torchrun job: the same round loop, with sums all-reduced and
per-client rows all-gathered. It counts the bytes each collective moves (`traffic`), so a
benchmark can report the communication volume per round.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from pipeline.common.errors import FedrcError
from pipeline.engine.rows import RowStore
from pipeline.places.communicate import Communicator, owners
from pipeline.places.launch import env_rank, launched, leaving_with_error, world_size

T = TypeVar("T")
TIMEOUT = timedelta(minutes=30)  # a rank waits this long for the others in one collective
_active: Group | None = None
__all__ = ["Group", "active", "env_rank", "launched", "leaving_with_error", "world_size"]


def active() -> Group | None:
    """The group of the run in progress in this process (None when not distributed)."""
    return _active


class Group(Communicator):
    """The ranks of one run, and the collectives they use; `traffic` counts the bytes.

    Client i (i-th participating, then i-th held-out, in id order) lives on rank i mod W for
    the whole run: a rank loads only its clients' shards and keeps their SGD momentum."""

    def __init__(self, rank: int, size: int, device: torch.device) -> None:
        super().__init__(device)
        self.rank, self.size = rank, size
        self.traffic = {"all_reduce": 0, "all_gather": 0, "broadcast": 0}
        self.owner: dict[int, int] = {}

    def place_clients(self, participating: list[int], held_out: list[int]) -> None:
        self.owner = owners(participating, held_out, self.size)

    def owns(self, client: int) -> bool:
        return self.owner[client] == self.rank

    @classmethod
    @contextmanager
    def start(cls, device_name: str) -> Iterator[Group]:
        """Join the process group torchrun prepared; leave it however the run ends.

        `device_name` is TrainConfig.device: auto / cuda give each rank `cuda:LOCAL_RANK` and
        NCCL, cpu (or no GPU under auto) gives gloo.
        """
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
        if cuda:
            if local_rank >= torch.cuda.device_count():
                raise FedrcError(
                    f"torchrun: LOCAL_RANK {local_rank} but torch sees "
                    f"{torch.cuda.device_count()} GPU(s); lower --nproc-per-node"
                )
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
        global _active
        try:
            _active = cls(dist.get_rank(), dist.get_world_size(), device)
            yield _active
        finally:
            _active = None
            dist.destroy_process_group()

    # --- the communicator's verbs --------------------------------------------------------
    def sum(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            if tensor.device == self.device:
                self.all_reduce(tensor)
            else:  # NCCL reduces CUDA tensors only
                tensor.copy_(self.all_reduce(tensor.to(self.device)))

    def gather(
        self,
        clients: list[int],
        local: dict[int, torch.Tensor],
        sizes: dict[int, int],
        empty: torch.Tensor,
    ) -> dict[int, torch.Tensor]:
        """One all-gather of every rank's rows (its own clients in `clients` order), cut back
        into clients."""
        blocks = [[c for c in clients if self.owner[c] == r] for r in range(self.size)]
        counts = [sum(sizes[c] for c in block) for block in blocks]
        mine = [local[c].to(self.device, empty.dtype) for c in blocks[self.rank]]
        rows = torch.cat(mine) if mine else empty.to(self.device)
        out = {}
        for block, part in zip(blocks, self.all_gather_rows(rows, counts)):
            offset = 0
            for client in block:
                out[client] = part[offset : offset + sizes[client]]
                offset += sizes[client]
        return out

    def all_rows(
        self, mine: Iterable[tuple[int, Callable[[], torch.Tensor]]], width: int
    ) -> Iterator[tuple[int, torch.Tensor]]:
        mine = list(mine)
        keys = self.all_gather_object([key for key, _ in mine])
        for step in range(max(map(len, keys))):
            row = mine[step][1]() if step < len(mine) else torch.zeros(width)
            sent = row.to(self.device, torch.float32)[None]
            blocks = self.all_gather_rows(sent, [1] * self.size)
            for rank, block in enumerate(blocks):
                if step < len(keys[rank]):
                    yield keys[rank][step], block[0].cpu()

    def share(self, store: RowStore) -> None:
        own = set(store.stored_keys())
        mine = [(key, lambda key=key: store.get(key)) for key in store.stored_keys()]
        for key, row in self.all_rows(mine, store.width):
            if key not in own:
                store.add(key, row)

    # --- collectives ---------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (`tensor` must live on `device`)."""
        dist.all_reduce(tensor)
        self.traffic["all_reduce"] += tensor.numel() * tensor.element_size()
        return tensor

    def all_gather_rows(self, tensor: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
        """Every rank's rows: rank r holds `counts[r]` rows of the same trailing shape and dtype.

        The counts are known everywhere, so the blocks are padded to the longest and gathered
        in one call (all_gather needs equal sizes on every rank).
        """
        longest = max(counts)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        blocks = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(blocks, padded.contiguous())
        self.traffic["all_gather"] += padded.numel() * padded.element_size() * self.size
        return [block[:n] for block, n in zip(blocks, counts)]

    def all_gather_object(self, value: Any) -> list[Any]:
        """Every rank's picklable `value` (small things: metadata, error messages)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        self.traffic["all_gather"] += len(pickle.dumps(value)) * self.size
        return out

    def broadcast(self, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        box = torch.empty(shape, dtype=torch.float32, device=self.device)
        if self.is_main:
            box.copy_(tensor)
        dist.broadcast(box, src=0)
        self.traffic["broadcast"] += box.numel() * box.element_size()
        return box.cpu()

    def broadcast_object(self, value: Any, src: int = 0) -> Any:
        """Rank `src`'s picklable `value` on every rank."""
        box = [value if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        self.traffic["broadcast"] += len(pickle.dumps(box[0]))
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on at least one."""
        votes = torch.tensor([float(flag)], device=self.device)
        return bool(self.all_reduce(votes) > 0)

    # --- agreement -----------------------------------------------------------------------
    def agree(self, step: Callable[[], T], everywhere: bool = True) -> T | None:
        """Run `step` (on every rank, or on rank 0 only) and fail on every rank if it failed
        on one: the lowest failing rank's FedrcError is raised everywhere, so no rank is left
        waiting in a collective that the failed rank will never join."""
        result, error = None, None
        if everywhere or self.is_main:
            try:
                result = step()
            except FedrcError as e:
                error = str(e)
        errors = self.all_gather_object(error)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            leaving_with_error()
            raise FedrcError(first)
        return result
