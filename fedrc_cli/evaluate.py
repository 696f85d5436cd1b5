"""`fedrc eval`: local and global accuracy, per concept, how the clusters match the concepts,
and the spread over clients of a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.table import Table

from fedrc_cli.common import ParamsOption, console, load_config, user_errors, writing
from fedrc_cli.options import dataclass_options, with_options
from pipeline.config import EvalConfig


def evaluate(params: ParamsOption = None, **options: Any) -> None:
    """Score a run: accuracies at the best-train round and the last round → eval.json."""
    with user_errors("score the run on a machine with more memory"):
        config = load_config(EvalConfig, params, **options)
        from pipeline import stages  # torch: imported once the options are known to be good

        run = Path(config.run)
        outputs = (run / "eval.json", run / "eval_clients.json")
        # a missing or broken run is the stage's own one-line error, so check only a folder
        with writing("--run", *outputs, folder=False, check=os.path.isdir(run)):
            result = stages.eval_stage(config)
    console.print(accuracy_table(result))
    print_purity_and_steps(result)
    console.print(f"Wrote {config.run}/eval.json and eval_clients.json")


def accuracy_table(result: dict[str, Any]) -> Table:
    """Local and global accuracy at the best-train round, the last round and the best global."""
    tuned = f", fine-tuned at lr {result['finetune_lr']:g}" if result["finetune"] else ""
    table = Table(title=f"{result['algorithm']} ({result['prediction']} prediction{tuned})")
    table.add_column("")
    table.add_column("round", justify="right")
    table.add_column("local", justify="right")
    table.add_column("global", justify="right")
    table.add_row(
        "best train accuracy",
        str(result["best_round"]),
        f"{result['local_accuracy']:.4f}",
        f"{result['global_accuracy']:.4f}",
    )
    table.add_row(
        "last round",
        str(result["final_round"]),
        f"{result['final_local_accuracy']:.4f}",
        f"{result['final_global_accuracy']:.4f}",
    )
    if "final_unlabeled_global_accuracy" in result:
        table.add_row(
            "last round, new clients unlabeled",
            str(result["final_round"]),
            "",
            f"{result['final_unlabeled_global_accuracy']:.4f}",
        )
    table.add_row(
        "best global (optimistic)",
        str(result["max_global_round"]),
        "",
        f"{result['max_global_accuracy']:.4f}",
    )
    return table


def print_purity_and_steps(result: dict[str, Any]) -> None:
    """Accuracy by concept, the rule for unlabeled new clients, concept and label purity, and a
    drifting run's table over its time steps."""
    by_concept = ", ".join(f"{k} {v:.3f}" for k, v in result["global_accuracy_by_concept"].items())
    console.print(f"global accuracy by concept (best round): {by_concept}")
    if "unlabeled_rule" in result:
        console.print(f"new clients without labels: {result['unlabeled_rule']}")
    purity = result["concept_purity"]
    if purity is None:
        console.print("clusters against concepts: n/a (one model)")
    else:
        console.print(
            f"clusters against concepts: matched share (concept purity) {purity:.3f}, "
            f"ARI {result['concept_ari']:.3f}, NMI {result['concept_nmi']:.3f}"
        )
    labels = result["label_purity"]
    console.print(f"label purity: {'n/a (one model)' if labels is None else f'{labels:.3f}'}")
    console.print(
        f"participating clients, last round: std {result['final_local_accuracy_std']:.3f}, "
        f"worst 10 % {result['final_local_accuracy_worst10']:.3f}"
    )
    if "over_time" in result:
        console.print(step_table(result["over_time"]))


def _shown(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def step_table(over: dict[str, Any]) -> Table:
    """A drifting run step by step: accuracy at the step's end and on the next step's data,
    the drifted clients before and after their drift, rounds to recover, purity and ARI."""
    table = Table(
        title=f"over {over['time_steps']} time steps ({over['rounds_per_step']} rounds a step)",
        caption="next: on the next step's data, before training on it; before / after: the "
        "drifted clients' accuracy; recover: rounds until within 1 point of before (no: not "
        "within the step)",
    )
    for name in ("step", "rounds", "local", "next", "drifted", "before", "after", "recover"):
        table.add_column(name, justify="right")
    table.add_column("purity", justify="right")
    table.add_column("ARI", justify="right")
    for s in over["steps"]:
        recover = s.get("recovery_rounds")
        drifted = bool(s["drifted_clients"])
        table.add_row(
            str(s["step"]),
            "–".join(map(str, s["rounds"])),
            _shown(s["local_accuracy"]),
            _shown(s["next_accuracy"]),
            str(s["drifted_clients"]),
            _shown(s.get("accuracy_before_drift")),
            _shown(s.get("accuracy_after_drift")),
            ("no" if recover is None else str(recover)) if drifted else "–",
            _shown(s["concept_purity"]),
            _shown(s.get("concept_ari")),
        )
    table.add_row(
        "mean",
        "",
        _shown(over["mean_local_accuracy"]),
        _shown(over["mean_next_accuracy"]),
        "",
        "",
        _shown(over["mean_accuracy_after_drift"]),
        _shown(over["mean_recovery_rounds"], 1),
        _shown(over["mean_concept_purity"]),
        _shown(over.get("mean_concept_ari")),
    )
    return table


with_options(evaluate, dataclass_options(EvalConfig, "eval", names={"hard": "--hard/--soft"}))
