"""Why is FedSoft's global accuracy so much higher here than in the paper's Table 1? A probe.

protocol §2: the FedRC authors' FedSoft port scores every held-out client with cluster model 0;
fedrc gives a held-out client the cluster whose model has the lowest loss on its labelled part,
as for the other hard-clustering methods. This script loads finished FedSoft runs (their last
round's models) and prints, per held-out client, the test accuracy of every cluster model, the
model fedrc picks, and the global accuracy under both rules. Run from the repository root:

    PYTHONPATH=. python experiments/fmnist/fedsoft_heldout.py experiments/fmnist/runs/fedsoft-s*
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pipeline.data.shards import load_federated
from pipeline.evaluation.accuracy import all_logits, per_sample_losses
from pipeline.run import files as rf
from pipeline.run.training import make_executor
from pipeline.stages import run_config


def held_out_scores(run: Path) -> list[tuple[str, list[float], int]]:
    """(concept, test accuracy of each model, index of the lowest-train-loss model) per
    held-out client."""
    config = run_config(run)
    data = load_federated(Path(config.data))
    executor = make_executor(config, data, torch.device("cpu"))
    models = rf.load_state(run / rf.MODEL)["models"]
    logits = all_logits(executor, models, data)
    rows = []
    for client in data.held_out:
        train, test = data.train_slices[client], data.test_slices[client]
        loss = per_sample_losses(logits[:, train], data.labels[train]).mean(0)
        hits = logits[:, test].argmax(-1) == data.labels[test]
        rows.append(
            (
                data.manifest.concept_name(client),
                hits.float().mean(1).tolist(),
                int(loss.argmin()),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="FedSoft run folders")
    args = parser.parse_args()
    for run in args.runs:
        rows = held_out_scores(run)
        print(f"{run}")
        for concept, accuracy, chosen in rows:
            cells = "  ".join(f"model {k}: {a:.3f}" for k, a in enumerate(accuracy))
            print(f"  {concept:>9}  {cells}  lowest loss: model {chosen}")
        lowest = sum(acc[chosen] for _, acc, chosen in rows) / len(rows)
        first = sum(acc[0] for _, acc, _ in rows) / len(rows)
        print(f"  global accuracy: lowest-loss model {lowest:.3f}, model 0 (port) {first:.3f}")


if __name__ == "__main__":
    main()
