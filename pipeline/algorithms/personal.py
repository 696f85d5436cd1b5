"""One global model and a personal model per client, trained together by a `LocalRule`: the
bookkeeping that APFL and pFedMe share (their modules hold their rules).

K = 1 and ω = 1: there is no clustering, and no E-step. A sampled client trains one task, which
starts from the global model and hands its batches to the method's rule
(`pipeline.engine.rules`); the trained row (the client's new copy of the global model) is
averaged N_i-weighted as in FedAvg, with the server learning rate η_g. The rule's extras (the
personal model, APFL's α_i) travel to every place as a shared row and are kept there as state, so
checkpoints hold every client's personal model. A participating client predicts with its
personal model (`personal_model`, `combine_personal`) once it has trained; until then, and for
a held-out client, the global model predicts.

Memory: every personal model stays in memory on every place (clients × model, as FedSoft's); a
round's new ones pass through a `RowStore` on disk.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import Rows
from pipeline.common.settings import Settings
from pipeline.engine.rows import RowStore
from pipeline.engine.rules import LocalRule
from pipeline.engine.task import LocalResult, LocalTask


class OneModelByRule(Algorithm):
    """One model, no E-step, and a local training of the method's own: a sampled client trains
    one task from the model, which hands its batches to `rule` (APFL, pFedMe, Floco)."""

    personal_models = True
    needs_sequential = own_training = True

    @classmethod
    def count_models(cls, clusters: int, settings: Settings) -> int:
        return 1

    @abstractmethod
    def rule(self, client: int, models: torch.Tensor) -> LocalRule:
        """The local training of client `client` this round, from the global `models`."""

    def assign(self, client: int, losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """No E-step: one model, every sample on it."""
        return torch.ones_like(losses)

    def reads(self, client: int) -> Rows:
        """None: no E-step, and the local training reads no logits."""
        return ()

    def local_tasks(
        self, client: int, gamma: torch.Tensor, models: torch.Tensor, raw: torch.Tensor
    ) -> list[LocalTask]:
        n = float(gamma.shape[0])
        return [LocalTask(0, models[0], gamma[:, 0], weight=n, rule=self.rule(client, models))]


class PersonalModels(OneModelByRule):
    """A method with a personal model per client beside one global model (module docstring);
    a subclass gives its `rule` and, if it keeps more than the model per client, `row` and
    `keep`."""

    local_training = "trains a personal model beside the global one (LocalTask.rule)"
    state_attributes: ClassVar[tuple[str, ...]] = ("personal",)
    row_extra: ClassVar[int] = 0  # numbers per client in a shared row after the model (`row`)

    def init_state(self) -> None:
        super().init_state()
        self.personal: dict[int, torch.Tensor] = {}  # client → its personal model (P,)
        self._rows: RowStore | None = None

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._rows = RowStore(models.shape[1] + self.row_extra)

    def row(self, result: LocalResult) -> torch.Tensor:
        """What every place keeps of a client's training: its personal model."""
        return result.extras["personal"]

    def keep(self, client: int, row: torch.Tensor) -> None:
        """Keep a shared row (`row`'s layout) as the client's state."""
        self.personal[client] = row.clone()

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        self.accumulate(0, result.params, task.weight)
        self._rows.add(client, self.row(result))

    def shared_rows(self) -> RowStore:
        return self._rows

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        """The personal models kept, then FedAvg's θ ← θ + η_g (Σ N_i w_i / Σ N_i − θ)."""
        for clients, rows in self._rows.blocks():
            for client, row in zip(clients, rows):
                self.keep(client, row)
        self._rows.close()
        return super().aggregate(models)

    def personal_model(self, client: int) -> torch.Tensor | None:
        return self.personal.get(client)
