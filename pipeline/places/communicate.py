"""Where a run's clients live and how what they contribute is combined across places.

The round loop (`pipeline.run.training`) is written once against this interface. A *place* holds
some of the clients: in one process there is one place holding all of them and every method
here is trivial; under torchrun each rank is a place (`pipeline.places.distributed.Group`), and the
same calls become all-reduces and all-gathers. What is combined is always one of three kinds:

- sums: an algorithm's running aggregates (`Algorithm.contributions`), added across places;
- per-client rows: every client's per-sample E-step losses, wanted by every place so that each
  calls the algorithm's `assign` for every sampled client and keeps identical state;
- stored vectors: a `RowStore` of per-client models that a rule needs all at once (CFL, FedSoft,
  FeSEM-CAM), streamed one row at a time so that no place holds more than one per place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from pipeline.engine.rows import RowStore

T = TypeVar("T")


class Communicator:
    """One place holding every client: nothing to exchange."""

    rank, size = 0, 1

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        """The place that writes the run's files."""
        return self.rank == 0

    def owns(self, client: int) -> bool:
        """Whether this place holds `client`'s data (and trains and scores it)."""
        return True

    def present(self, clients: list[int]) -> list[int]:
        """Those of a round's sampled `clients` that can take part: all of them here and under
        torchrun; in a Flower deployment, those whose node is connected."""
        return clients

    def place_clients(self, participating: list[int], held_out: list[int]) -> None:
        """Decide which place holds which client (before the data is loaded)."""

    def sum(self, tensors: Iterable[torch.Tensor]) -> None:
        """Add each tensor over the places, in place (tensors live on `device`)."""

    def gather(
        self,
        clients: list[int],
        local: dict[int, torch.Tensor],
        sizes: dict[int, int],
        empty: torch.Tensor,
    ) -> dict[int, torch.Tensor]:
        """Every client's rows (sizes[c], …) on every place, from those of the place's own;
        `empty` is a (0, …) tensor of the rows' trailing shape and dtype."""
        return local

    def all_rows(
        self, mine: Iterable[tuple[int, Callable[[], torch.Tensor]]], width: int
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Every place's (key, float32 row of `width`) on every place, one row per place at a
        time; `mine` gives each key with a function that reads its row when it is sent."""
        for key, read in mine:
            yield key, read()

    def share(self, store: RowStore) -> None:
        """Every place's rows in every place's `store`."""

    def any(self, flag: bool) -> bool:
        """True on every place when `flag` is true on one."""
        return flag

    def agree(self, step: Callable[[], T], everywhere: bool = True) -> T | None:
        """Run `step` (everywhere, or on the main place only); fail everywhere if it failed."""
        return step()

    def broadcast(self, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        """The main place's float32 `tensor` of `shape` on every place (None elsewhere)."""
        return tensor

    def broadcast_object(self, value: Any) -> Any:
        """The main place's picklable `value` on every place."""
        return value

    def all_gather_object(self, value: Any) -> list[Any]:
        """Every place's picklable `value`, in place order."""
        return [value]

    def measured_bytes(self) -> dict[str, int]:
        """Bytes measured on the wire since the last call, for the round's metrics row (a
        Flower server: the records it sent to and received from the nodes); nothing here."""
        return {}


def owners(participating: list[int], held_out: list[int], size: int) -> dict[int, int]:
    """client id → place: round-robin over the participating clients, then the held-out ones,
    so every place gets its share of both and a place's clients never change during a run."""
    own = {}
    for ids in (participating, held_out):
        own.update({client: i % size for i, client in enumerate(ids)})
    return own
