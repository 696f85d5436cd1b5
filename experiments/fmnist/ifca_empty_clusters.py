"""Why is IFCA so much better here than in the paper's Table 1? A probe, not a stage.

The FedRC authors' IFCA port sets a cluster model that no client chose this round to zero
(protocol §2; fedrc keeps the previous model instead). A zeroed CNN is dead: every ReLU input is 0,
so no gradient reaches its weights and it can only learn the last bias, i.e. a label prior.
This script trains IFCA on a benchmark twice from the same seed, once as fedrc does and once
with the port's zeroing, and prints per evaluated round how many clients chose each model and
the accuracies. Run from the repository root after the pipeline's `partition` stage:

    PYTHONPATH=. python experiments/fmnist/ifca_empty_clusters.py \
        --data experiments/fmnist/data/federated --rounds 20 --local-epochs 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pipeline.algorithms.ifca import IFCA
from pipeline.config import TrainConfig
from pipeline.data.shards import load_federated
from pipeline.evaluation.accuracy import evaluate_round
from pipeline.places.communicate import Communicator
from pipeline.run.training import build_run, train_round


class ZeroingIFCA(IFCA):
    """IFCA as the FedRC code base aggregates it: a model without members becomes all zeros."""

    def aggregate(self, models: torch.Tensor) -> torch.Tensor:
        new = super().aggregate(models)
        new[self.totals == 0] = 0.0
        return new


def run(config: TrainConfig, zero_empty: bool) -> list[tuple[int, list[int], dict]]:
    data = load_federated(Path(config.data))
    comm = Communicator(torch.device("cpu"))
    training = build_run(config, data, comm)
    if zero_empty:
        training.algorithm.__class__ = ZeroingIFCA
    rows, cached = [], None  # an evaluation's logits serve the next E-step, as in training
    for round_ in range(1, config.rounds + 1):
        train_round(round_, training, cached)
        cached = None
        if round_ % config.eval_every == 0 or round_ == config.rounds:
            algorithm = training.algorithm
            scores, cached, _ = evaluate_round(
                algorithm, training.executor, training.models, data, comm
            )
            members = algorithm.omega[data.participating].sum(0).round().int().tolist()
            rows.append((round_, members, scores))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="experiments/fmnist/data/federated")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = TrainConfig(
        data=args.data,
        algorithm="ifca",
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        lr=args.lr,
        eval_every=args.eval_every,
        seed=args.seed,
        device="cpu",
    )
    keep, zero = run(config, zero_empty=False), run(config, zero_empty=True)
    print(
        "| round | clients per model (fedrc) | train / global (fedrc) "
        "| clients per model (zeroing) | train / global (zeroing) |"
    )
    print("|---|---|---|---|---|")
    for (round_, members_k, k), (_, members_z, z) in zip(keep, zero):
        print(
            f"| {round_} | {members_k} | {k['train_accuracy']:.3f} / {k['global_accuracy']:.3f} "
            f"| {members_z} | {z['train_accuracy']:.3f} / {z['global_accuracy']:.3f} |"
        )


if __name__ == "__main__":
    main()
