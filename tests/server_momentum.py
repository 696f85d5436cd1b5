"""A plugin as a user writes one on a built-in method: server momentum (FedAvgM, Hsu et al.,
2019) on FedAvg and on IFCA, one verb each (`aggregate`), importing only `pipeline.plugin`.
Named `server_momentum:FedAvgM` and `server_momentum:IFCAM` in the tests; both must keep their
parent's client part, so that a node sends exactly what the parent's nodes send."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.plugin import IFCA, FedAvg, Settings, require, setting


@dataclass(frozen=True)
class MomentumSettings(Settings):
    beta: float = setting(0.9, "server momentum β (0: the parent's aggregation)")

    def validate(self) -> None:
        require(0 <= self.beta < 1, "beta", "a number in [0, 1)", self.beta)


class ServerMomentum:
    """v ← β v + (θ − θ̄), θ ← θ − v for every model row, θ̄ the parent's aggregate. The
    velocity has the models' shape, which `init_state` does not know: it starts as None and is
    made from the first round's models, and `state_attributes` puts it in checkpoints."""

    Settings = MomentumSettings
    state_attributes = ("velocity",)

    def init_state(self) -> None:
        super().init_state()
        self.velocity: torch.Tensor | None = None

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        step = models - super().aggregate(models)  # 0 for a row nobody trained
        if self.velocity is None:
            self.velocity = torch.zeros_like(models)
        self.velocity = self.settings.beta * self.velocity + step
        return models - self.velocity


class FedAvgM(ServerMomentum, FedAvg):
    name = "fedavgm"
    title = "FedAvgM"
    paper = "Hsu et al., arXiv 2019 (a test plugin)"


class IFCAM(ServerMomentum, IFCA):
    name = "ifcam"
    title = "IFCA with server momentum"
    paper = "a test plugin"


class FedAvgMByAssign(FedAvgM):
    """What the tester had to write before the built-ins were bases: FedAvg's E-step again, as
    `assign`. It drops the client part: the E-step falls back to the server."""

    name = "fedavgm-assign"

    def assign(self, client, losses, labels):
        return torch.ones_like(losses)
