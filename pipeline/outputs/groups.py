"""Runs → groups: the runs of one algorithm under one configuration that differ only in their
seed, each group a row of the report, named as a paper names it ("CFL(3)", "FedRC-FT")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.algorithms import ALGORITHMS, num_models
from pipeline.algorithms.base import HardClustering
from pipeline.common.errors import FedrcError
from pipeline.outputs.runs import EVAL_KEYS, METRICS, Run, run_settings


@dataclass
class Group:
    """Runs of one algorithm and configuration that differ only in the seed."""

    key: tuple
    runs: list[Run] = field(default_factory=list)
    label: str = ""  # its row's name, with what tells it from others of its algorithm
    base: str = ""  # the name its algorithm and eval settings give ("FedRC-FT", "CFL(3)")
    selected: bool = True  # of the groups sharing a label, the one the paper's rule picks

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config

    @property
    def finetuned(self) -> bool:
        """FedRC-FT: only its last-round scores are fine-tuned (eval.json's best-train and
        max numbers, and the logged curves, are the models before fine-tuning)."""
        return bool(self.runs[0].result["finetune"])

    def values(self, stem: str) -> list[float]:
        key = METRICS[stem]  # OPTIONAL ones may be absent
        return [r.result[key] for r in self.runs if r.result.get(key) is not None]


def _identity(run: Run) -> tuple:
    """The run's configuration apart from its seed, plus the eval settings."""
    identity = run_settings(run).identity()
    identity.pop("seed")
    identity.update({k: run.result[k] for k in EVAL_KEYS})
    identity["finetune_lr"] = own_finetune_lr(run)
    return tuple(sorted((k, json.dumps(v)) for k, v in identity.items()))


def own_finetune_lr(run: Run) -> float | None:
    """FedRC-FT's lr where it is not the run's own (eval.json's `finetune_lr`, from
    `--finetune-lr`); None for the run's lr and for results written before it was recorded."""
    lr = run.result.get("finetune_lr")
    return None if lr is None or lr == run.config.get("lr") else lr


def base_label(run: Run) -> str:
    """The algorithm's title with its variant ("CFL(3)"), "-FT" when fine-tuned, " (hard)" when
    predicting with one model is not the method's own rule: a hard-clustering method (IFCA,
    CFL, FeSEM) predicts with its cluster's model, which is what its paper reports."""
    config = run_settings(run)
    algorithm = ALGORITHMS.get(config.algorithm)
    name = algorithm.label(config.algorithm_settings) + ("-FT" if run.result["finetune"] else "")
    if (lr := own_finetune_lr(run)) is not None:
        name += f" (FT lr {lr:g})"
    own_rule = issubclass(algorithm, HardClustering)
    return name + (" (hard)" if run.result["prediction"] == "hard" and not own_rule else "")


def group_runs(runs: list[Run], order: list[str]) -> list[Group]:
    """Groups in the order of `order` (labels, e.g. a paper's rows), then by label; one
    benchmark for all, and one run per seed in a group; each run once (copies of one run
    score one model: counted as seeds, they would fake a spread)."""
    first = runs[0]
    for run in runs[1:]:
        if run.config["data_digest"] != first.config["data_digest"]:
            raise FedrcError(
                f"{run.path}: trained on another benchmark than {first.path} (the shards' "
                "hashes differ); report runs of one benchmark at a time"
            )
    groups: dict[tuple, Group] = {}
    for run in runs:
        key = _identity(run)
        groups.setdefault(key, Group(key)).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: r.seed)
        seeds = [r.seed for r in group.runs]
        if len(set(seeds)) != len(seeds):
            twice = next(s for s in seeds if seeds.count(s) > 1)
            paths = [str(r.path) for r in group.runs if r.seed == twice]
            raise FedrcError(
                f"{paths[1]}: same configuration and seed {twice} as {paths[0]} (a copy of "
                "one run would count as two seeds)"
            )
        group.label = group.base = base_label(group.runs[0])
    scored: dict[tuple, Path] = {}
    for run in runs:  # a copy whose seed was edited in config.json, too
        key = (run.model_digest, *(run.result[k] for k in EVAL_KEYS), own_finetune_lr(run))
        if key in scored:
            raise FedrcError(
                f"{run.path}: the same run as {scored[key]} (its eval.json scored the same "
                "model, evaluated alike); give each run once"
            )
        scored[key] = run.path
    _disambiguate(list(groups.values()))

    def place(group: Group) -> tuple[int, str]:
        return (order.index(group.base) if group.base in order else len(order), group.label)

    return sorted(groups.values(), key=place)


def _disambiguate(groups: list[Group]) -> None:
    """Groups sharing a label get the keys they differ in ("FedRC lr=0.03"); among them the
    one with the best mean train accuracy is `selected` (the paper's learning-rate rule)."""
    by_label: dict[str, list[Group]] = {}
    for group in groups:
        by_label.setdefault(group.label, []).append(group)
    for label, same in by_label.items():
        if len(same) == 1:
            continue
        dicts = [dict(g.key) for g in same]
        differ = sorted(k for k in dicts[0] if len({d.get(k) for d in dicts}) > 1)
        for group, d in zip(same, dicts):
            group.label = label + " " + " ".join(f"{k}={json.loads(d[k])}" for k in differ)
        best = max(same, key=lambda g: float(np.mean(g.values("train"))))
        for group in same:
            group.selected = group is best


def drawn_groups(groups: list[Group]) -> list[Group]:
    """The selected groups that cluster (more than one model), one per training
    configuration: ω comes from training, so a configuration scored both soft and hard (or
    fine-tuned) would draw the same ω twice; its plainly scored group is kept, else the first."""

    def plain(group: Group) -> bool:
        result = group.runs[0].result
        return not result["finetune"] and result["prediction"] == "soft"

    chosen: dict[tuple, Group] = {}
    for group in groups:
        if not group.selected or num_models(run_settings(group.runs[0])) == 1:
            continue
        trained = tuple(item for item in group.key if item[0] not in EVAL_KEYS)
        if trained not in chosen or (plain(group) and not plain(chosen[trained])):
            chosen[trained] = group
    drawn = [id(g) for g in chosen.values()]
    return [g for g in groups if id(g) in drawn]


def find_group(groups: list[Group], name: str, option: str) -> Group:
    """The group a user names by its label ("FedRC lr=0.03") or its algorithm ("fedavg", when
    one group has it); a one-line error naming `option` otherwise."""
    exact = [g for g in groups if g.label.lower() == name.lower()]
    by_algorithm = [g for g in groups if g.config["algorithm"] == name.lower()]
    match = exact or by_algorithm
    if len(match) == 1:
        return match[0]
    labels = ", ".join(f"'{g.label}'" for g in groups)
    if not match:
        raise FedrcError(f"{option}: no row named '{name}'; the rows are {labels}")
    several = ", ".join(f"'{g.label}'" for g in match)
    raise FedrcError(f"{option}: '{name}' names several rows ({several}); give one row's label")
