"""Noise on the uploaded label tables (FedRC paper, Table 10): N(0, ξ²) added to every entry of
each table a client sends, drawn where the tables are received (the server), in client order,
from the run's seeded generator."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms.base import Algorithm
from pipeline.algorithms.client import Upload
from pipeline.algorithms.settings import TableNoiseSettings


class TableNoise(Algorithm):
    """The server's part, for a host that keeps each client's (K, classes) table in `tables`
    (FedRC) and has stored it when this `receive` runs."""

    settings: TableNoiseSettings
    tables: torch.Tensor

    def init_state(self) -> None:
        super().init_state()
        self.noise = torch.Generator().manual_seed(self.config.seed)

    def receive(self, client: int, upload: Upload) -> None:
        super().receive(client, upload)
        xi = self.settings.table_noise
        if xi > 0:
            shape = self.tables.shape[2], self.tables.shape[1]  # drawn as (classes, K)
            self.tables[client] += (xi * torch.randn(shape, generator=self.noise)).T

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "noise_state": self.noise.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.noise.set_state(state.pop("noise_state"))
        super().load_state_dict(state)
