"""FeSEM (Long et al., WWW Journal 2023): clients move to the centre nearest to their model.

Round t: client i trains the model of its current cluster c_i (first assignment: the lowest
loss); after training, the server reassigns it to the nearest centre,
c_i ← argmin_k ‖w_i − θ_k‖₂ (θ_k the centres it started the round with), and each centre
becomes the N_i-weighted average of its new members. The client's trained weights count in its
new cluster. The FedRC authors' release differs twice (protocol §2): a client that changes
cluster adds the copy of its new cluster's model it received, untrained, in place of its
trained weights (`untrained_movers`), and a cluster without members is zeroed (`zero_empty`).

Where the data stays (the client part, `ClusterStep`): the server hands each sampled client its
cluster (none at first: it takes the model with the lowest loss on its data); the client sends
up ω_i, one-hot on the model it trains, beside its trained model.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.algorithms import described
from pipeline.algorithms.base import HardClustering
from pipeline.algorithms.client import ClusterStep, Upload, one_hot
from pipeline.algorithms.ifca import zero_unchosen
from pipeline.algorithms.settings import FeSEMSettings
from pipeline.engine.task import LocalResult, LocalTask


@described("fesem")
class FeSEM(HardClustering):
    settings: FeSEMSettings
    Step = ClusterStep  # its cluster (−1: none yet)

    def init_state(self) -> None:
        super().init_state()
        self.cluster = torch.full((self.num_clients,), -1, dtype=torch.long)
        self._received: torch.Tensor | None = None  # the round's θ_k
        self._centres: torch.Tensor | None = None  # the same in float64, for distances
        self._moved: torch.Tensor | None = None  # (clients,): 1 + the new cluster, 0: not moved

    def client_step(self, client: int) -> ClusterStep:
        return ClusterStep(int(self.cluster[client]))

    def receive(self, client: int, upload: Upload) -> None:
        super().receive(client, upload)
        self.cluster[client] = int(self.omega[client].argmax())

    def begin_round(self, models: torch.Tensor) -> None:
        super().begin_round(models)
        self._received = models  # what a client gets (a released mover adds it untrained)
        self._centres = models.double()  # once a round, not K × model converted at each fold
        self._moved = torch.zeros(self.num_clients, dtype=torch.float64, device=models.device)

    def fold(self, client: int, task: LocalTask, result: LocalResult) -> None:
        distances = torch.cdist(result.params[None].double(), self._centres)[0]
        k = int(distances.argmin())
        self._moved[client] = k + 1
        moved = k != task.model and self.as_released("untrained_movers")
        self.sums[k] += task.weight * (self._received[k] if moved else result.params)
        self.totals[k] += task.weight

    def contributions(self) -> list[torch.Tensor]:
        return [*super().contributions(), self._moved]

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        for client in self._moved.nonzero().flatten().tolist():
            k = int(self._moved[client]) - 1
            self.cluster[client] = k
            self.omega[client] = one_hot(k, self.num_models)
        new = super().aggregate(models)
        return zero_unchosen(new, self.totals) if self.as_released("zero_empty") else new

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cluster": self.cluster}
