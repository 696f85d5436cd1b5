"""The four stage functions the CLI calls. Each reads only the previous stage's files."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.algorithms import ALGORITHMS, build_algorithm, num_models
from pipeline.algorithms.base import Algorithm
from pipeline.common.checks import require_finite
from pipeline.common.dvc_stage import stage_root
from pipeline.common.errors import FedrcError, first_few
from pipeline.common.io import atomic_files, json_text, remove_leftovers
from pipeline.common.reading import parse_json
from pipeline.common.run_lock import writer_lock
from pipeline.common.sources import module_digest
from pipeline.config import (
    EvalConfig,
    PartitionConfig,
    PlotConfig,
    TrainConfig,
    build_config,
    config_dict,
)
from pipeline.data.benchmark import build_clients, foreign_files, write_benchmark
from pipeline.data.loaders import DATASETS, PREFIX, dataset_spec, load_dataset
from pipeline.data.meaning import read_benchmark
from pipeline.data.records import MANIFEST, Manifest, read_manifest
from pipeline.data.shards import FederatedData, data_digest, load_federated
from pipeline.evaluation.accuracy import (
    all_logits,
    concept_purity,
    finetuned_logits,
    label_purity,
    personal_logits,
    score_clients,
    summarize,
    unlabeled_omega,
)
from pipeline.evaluation.agreement import cluster_agreement
from pipeline.evaluation.drift_scores import over_time
from pipeline.evaluation.spread import client_spread
from pipeline.models.layout import head_range
from pipeline.places import distributed
from pipeline.run import files as rf
from pipeline.run.assignments import read_assignments
from pipeline.run.code import run_code
from pipeline.run.derived import (
    EVAL,
    EVAL_CLIENTS,
    PLOTS,
    foreign_plots,
    made_from,
    model_digest,
    state_digest,
)
from pipeline.run.resolve import from_values, recorded_identity, train_config
from pipeline.run.setup import check_fits
from pipeline.run.staged import train_staged
from pipeline.run.training import make_executor, resolve_device, run_training

__all__ = [
    "check_stage",
    "eval_stage",
    "partition_stage",
    "plot_stage",
    "run_training",
    "train_stage",
    "write_resolved",
]
CHECKED = ("partition", "train", "eval", "plot")


def check_stage(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each stage's configuration as its command would build it from `params` (no options),
    with the digests of the code it runs (`pipeline.run.code`).

    A DVC pipeline runs this first: a bad key or value stops it here, before DVC removes the
    outputs of the stage it would rerun; a plugin edited since changes the resolved file its
    stage depends on. `check_feasible` then checks what only the data can tell."""
    partition = build_config(PartitionConfig, params)
    train = train_config(params)
    return {
        "partition": {**config_dict(partition), "code": dataset_code(partition.dataset)},
        "train": {**config_dict(train), "code": run_code(train)},
        "eval": config_dict(build_config(EvalConfig, params)),
        "plot": config_dict(build_config(PlotConfig, params)),
    }


def check_feasible(params: dict[str, Any], runs: tuple[TrainConfig, ...] = ()) -> None:
    """What the check can know before any stage runs beyond the values: that partition's
    settings can be split as asked (unless its benchmark is built already), and that the K
    models of the train section's run, and of `runs` (a sweep's points), fit in memory."""
    partition = build_config(PartitionConfig, params)
    train = train_config(params)
    benchmark = check_benchmark_settings(partition, Path(train.data))
    for config in (train, *runs):  # a sweep over `data` may name benchmarks made elsewhere
        same = os.path.abspath(config.data) == os.path.abspath(train.data)
        check_fits(config, *(benchmark if same else _built_shape(Path(config.data))))


def dataset_code(dataset: str) -> dict[str, str]:
    """The digest of a dataset plugin's package ({} for a built-in, whose code the stage's
    deps list, and for a Hugging Face dataset, which is data)."""
    dataset_spec(dataset)  # an unknown name, or a plugin that fails to import
    module = None if dataset.startswith(PREFIX) else DATASETS.module(dataset)
    return dict([module_digest(module)]) if module is not None else {}


def check_benchmark_settings(
    partition: PartitionConfig, data: Path
) -> tuple[tuple[int, int, int], int]:
    """Check that the partition section can be built, as `fedrc partition` would before
    writing (every split and draw; the dataset is loaded), unless `partition.out` already holds
    the benchmark of these settings. Returns the image shape and classes of the benchmark
    train.data names."""
    out = Path(partition.out)
    built = _built_with(out, partition)
    if built is None:
        raw = load_dataset(partition.dataset, partition.data_root, partition.hub)
        build_clients(partition, raw)  # draws only; images are gathered when iterated
        if os.path.abspath(data) == os.path.abspath(out):
            return raw.image_shape, raw.num_classes
    elif os.path.abspath(data) == os.path.abspath(out):
        return built.image_shape, built.num_classes
    return _built_shape(data)


def _built_shape(data: Path) -> tuple[tuple[int, int, int], int]:
    """The image shape and classes of the benchmark in `data`, which partition.out is not: it
    must be there already."""
    if not (data / MANIFEST).is_file():
        raise FedrcError(
            f"train.data: {data} holds no benchmark, and partition.out is another folder; "
            "point train.data at partition.out or at a benchmark `fedrc partition` wrote"
        )
    manifest = read_manifest(data, "train.data")
    return manifest.image_shape, manifest.num_classes


def _built_with(out: Path, partition: PartitionConfig) -> Manifest | None:
    """The manifest in `out` when it records exactly these partition settings."""
    if not (out / MANIFEST).is_file():
        return None
    try:
        manifest = read_manifest(out, "partition.out")
    except FedrcError:
        return None  # partition replaces it (or says what is wrong)
    wanted = {k: v for k, v in config_dict(partition).items() if k != "out"}
    return manifest if json.loads(json.dumps(wanted)) == manifest.config else None


def write_resolved(resolved: dict[str, dict[str, Any]], out: Path) -> None:
    """`out/<stage>.json` for each checked stage (all files or none): a stage depends on its
    own file, so it runs after the check and only when its own section's values change."""
    with atomic_files(*(out / f"{name}.json" for name in resolved)) as tmps:
        for tmp, name in zip(tmps, resolved):
            tmp.write_text(json.dumps(resolved[name], indent=2, sort_keys=True) + "\n")


def partition_stage(config: PartitionConfig, overwrite: bool = False) -> Manifest:
    """Build the benchmark and write it to `config.out` in one atomic step; returns the manifest.

    A benchmark already in `config.out` is replaced only with `overwrite` (runs trained on it
    would no longer evaluate); a folder holding anything else is never replaced."""
    refuse_replacing_here(Path(config.out))
    with writer_lock(config.out, "--out", "fedrc partition", beside=True):
        out = Path(os.path.abspath(config.out))  # "." and "x/.." have a name here
        # a killed partition's temporary folder; a benchmark it had moved aside comes back
        remove_leftovers(out.parent, [out.name])
        check_partition_out(Path(config.out), overwrite)
        return write_benchmark(config, load_dataset(config.dataset, config.data_root, config.hub))


def refuse_replacing_here(out: Path) -> None:
    """`--out` is replaced whole (moved aside, then removed): never the current folder, one
    holding it, or the file system's root."""
    target, here = Path(os.path.realpath(out)), Path(os.path.realpath("."))
    if target == target.parent or target == here or target in here.parents:
        raise FedrcError(
            f"--out: {out} is the current folder or holds it, and fedrc replaces --out whole; "
            "name a folder of its own (e.g. data/federated)"
        )


def check_partition_out(out: Path, overwrite: bool) -> None:
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MANIFEST).is_file():
        raise FedrcError(
            f"--out: {out} is a folder with other files and no fedrc benchmark; choose another "
            "--out (fedrc replaces only its own benchmarks)"
        )
    foreign = foreign_files(out)
    if foreign:
        raise FedrcError(
            f"--out: {out} holds a benchmark and files fedrc did not write ({first_few(foreign)}); "
            "replacing it would delete them: move them out or choose another --out"
        )
    if not overwrite:
        raise FedrcError(
            f"--out: {out} already holds a benchmark; pass --overwrite to replace it (runs "
            "trained on it will no longer evaluate)"
        )


def train_stage(config: TrainConfig, **kwargs: Any) -> Path:
    """Train in --out; as a DVC stage (one process, not --resume), in a staging folder that
    DVC does not delete, so that a stopped `dvc repro` resumes (`pipeline.run.staged`)."""
    root = stage_root()
    if root is None or kwargs.get("resume") or distributed.launched():
        return run_training(config, **kwargs)
    kwargs.pop("resume", None)
    return train_staged(config, root, **kwargs)


def run_config(run: Path, option: str = "--run") -> TrainConfig:
    path = run / rf.CONFIG
    if not path.is_file():
        raise FedrcError(f"{option}: {path} not found (is {run} a `fedrc train` output?)")
    try:
        values = parse_json(path.read_text())
        if not isinstance(values, dict):
            raise TypeError("not a mapping")
        values.pop("data_digest", None)
        config = from_values(values)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, AttributeError) as e:
        raise FedrcError(f"{path}: not a fedrc run configuration ({e})") from None
    except FedrcError as e:
        raise FedrcError(f"{path}: {e}") from None
    return config


def run_digest(run: Path) -> str:
    """The content hash of the benchmark the run was trained on, as config.json records it."""
    path = run / rf.CONFIG
    digest = json.loads(path.read_text()).get("data_digest")  # run_config read it already
    if not isinstance(digest, str):
        raise FedrcError(f"{path}: not a fedrc run configuration (no data_digest)")
    return digest


def check_benchmark(run: Path, data: str, manifest: Manifest) -> str:
    """The benchmark in `data` is the one the run was trained on; returns its content hash."""
    digest = data_digest(manifest)
    if run_digest(run) != digest:
        raise FedrcError(
            f"{run / rf.CONFIG}: trained on other data than {data} (the benchmark's content "
            "hash differs: it was partitioned again or edited since); retrain, or point "
            "train.data at the data it was trained on"
        )
    return digest


def _at(row: dict[str, Any], prefix: str) -> dict[str, Any]:
    keys = ("train_accuracy", "local_accuracy", "global_accuracy", "global_accuracy_by_concept")
    return {k: row[prefix + k] for k in keys}


def eval_stage(config: EvalConfig) -> dict[str, Any]:
    """eval.json: accuracies at the best-train round and the last round, concept and label
    purity; per client. The run folder is held while it is scored (`pipeline.common.run_lock`)."""
    with writer_lock(config.run, "--run", "fedrc eval", create=False):
        remove_leftovers(Path(config.run), (EVAL, EVAL_CLIENTS))  # a killed eval's temporary files
        return _evaluate(config)


def _evaluate(config: EvalConfig) -> dict[str, Any]:
    run = Path(config.run)
    train_config, final, data_hash, data = _open_model(run)
    prefix = "hard_" if config.hard else ""
    metrics, best, top = _selected_rounds(run, prefix)
    device = resolve_device("auto")
    executor, algorithm, model = _checked_final(run, train_config, data, final, metrics, device)
    algorithm.load_state_dict(final["algorithm"])
    data = data.at_step(data.time_steps - 1).to(device)  # the final models, on the last step
    table, final_summary, unlabeled = _score_final(
        config, train_config, algorithm, executor, final, data, run
    )
    part = np.asarray(data.participating)
    omega = final["omega"].numpy()
    concepts = np.asarray([c.concept for c in data.clients])
    sizes = np.asarray([c.train_size for c in data.clients], dtype=float)
    histograms = np.asarray([c.label_histogram for c in data.clients], dtype=float)
    result = {
        "algorithm": train_config.algorithm,
        "prediction": "hard" if config.hard else "soft",
        "finetune": config.finetune,
        "finetune_lr": (config.finetune_lr or train_config.lr) if config.finetune else None,
        "best_round": best["round"],
        **_at(best, prefix),
        "final_round": final["round"],
        **{f"final_{k}": v for k, v in final_summary.items()},
        **unlabeled,
        "max_global_accuracy": top[prefix + "global_accuracy"],
        "max_global_round": top["round"],
        "concept_purity": concept_purity(omega[part], concepts[part], sizes[part]),
        "label_purity": label_purity(omega[part], histograms[part]),
        **cluster_agreement(omega[part], concepts[part]),
        **client_spread(table[:, 1].numpy()[part].tolist(), "final_local_accuracy"),
    }
    clients_text = json_text(_client_rows(data, table, omega))
    result["made_from"] = made_from(model, final["round"], data_hash, clients_text)
    if data.time_steps > 1:
        identity = rf.run_identity(train_config, data_hash)
        evaluated, k = rf.evaluated_rounds(metrics), num_models(train_config)
        assignments = read_assignments(
            run / rf.ASSIGNMENTS, identity, len(data.clients), evaluated, k
        )
        per_step = train_config.rounds_per_step or train_config.rounds // data.time_steps
        result["over_time"] = over_time(
            metrics, assignments, data.benchmark, per_step, final["round"], prefix
        )
    require_finite(f"{run / rf.MODEL}: round {final['round']}", result, None)
    with atomic_files(run / EVAL_CLIENTS, run / EVAL) as (tmp_clients, tmp):
        tmp_clients.write_text(clients_text)
        tmp.write_text(json_text(result))
    return result


def _open_model(run: Path) -> tuple[TrainConfig, dict[str, Any], str, FederatedData]:
    """The run's configuration, its model.pt's state, the benchmark hash it records and the
    benchmark, once model.pt is known to be this run's, trained on that benchmark."""
    train_config = run_config(run)
    if not (run / rf.MODEL).exists() and (run / rf.CHECKPOINT).is_file():
        raise FedrcError(
            f"{run / rf.MODEL}: not found: the run stopped at a checkpoint and has not "
            "finished; finish it with `fedrc train --resume`, then evaluate"
        )
    final = rf.load_state(run / rf.MODEL)
    recorded = recorded_identity(rf.state_identity(run / rf.MODEL, final), f"{run / rf.MODEL}")
    data = load_federated(Path(train_config.data))
    if recorded.get("data_digest") != data_digest(data.manifest):
        raise FedrcError(
            f"{run / rf.MODEL}: trained on other data than {train_config.data} (the shards' "
            "hashes differ); retrain, or point train.data at the data it was trained on"
        )
    wanted = {**train_config.identity(), "data_digest": recorded["data_digest"]}
    other = rf.identity_mismatch(recorded, wanted)
    if other is not None:
        raise FedrcError(f"{run / rf.MODEL}: does not belong to {run / rf.CONFIG}: {other}")
    return train_config, final, recorded["data_digest"], data


def _selected_rounds(run: Path, prefix: str) -> tuple[list[dict[str, Any]], dict, dict]:
    """metrics.jsonl, its row with the best train accuracy and the one with the best global."""
    metrics = rf.read_metrics(run / rf.METRICS)
    evaluated = [r for r in metrics if "train_accuracy" in r]
    if not evaluated:
        raise FedrcError(f"{run / rf.METRICS}: no evaluated round")
    best = max(evaluated, key=lambda r: r[prefix + "train_accuracy"])
    top = max(evaluated, key=lambda r: r[prefix + "global_accuracy"])
    return metrics, best, top


def _checked_final(
    run: Path,
    train_config: TrainConfig,
    data: FederatedData,
    final: dict[str, Any],
    metrics: list[dict[str, Any]],
    device: torch.device,
) -> tuple[Any, Algorithm, str]:
    """The executor and algorithm that score model.pt, and its digest, once its shapes, fields
    and round are checked against the run (before anything in it is used)."""
    executor = make_executor(train_config, data, device)
    head = head_range(executor.model)
    algorithm = build_algorithm(train_config, len(data.clients), data.num_classes, head)
    flat = executor.flatten()
    expect = rf.Expected(
        rounds=train_config.rounds,
        models=(algorithm.num_rows, flat.numel()),
        dtype=flat.dtype,
        omega=tuple(algorithm.omega_table().shape),
        algorithm=algorithm.state_dict(),
        metrics=run / rf.METRICS,
        logged=max((r["round"] for r in metrics), default=0),
    )
    rf.check_model(run / rf.MODEL, final, expect)
    if final["round"] != expect.logged:  # best-train and last round must be one run's
        raise FedrcError(
            f"{run / rf.MODEL}: holds round {final['round']}, but {run / rf.METRICS} runs to "
            f"round {expect.logged}: the run was extended and has not finished; finish it with "
            "`fedrc train --resume`, then evaluate"
        )
    return executor, algorithm, state_digest(final)


def _score_final(
    config: EvalConfig,
    train_config: TrainConfig,
    algorithm: Algorithm,
    executor: Any,
    final: dict[str, Any],
    data: FederatedData,
    run: Path,
) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """Score the final models afresh (the numbers a user gets from model.pt, not from the
    log): every client's (train, test, scored) table, its summary, and the held-out clients'
    scores without their labels when `config.unlabeled`."""
    models = final["models"].to(data.images.device)
    everyone = list(range(len(data.clients)))
    logits = algorithm.combine_logits(all_logits(executor, models, data))
    require_finite(f"{run / rf.MODEL}: round {final['round']}", {}, logits)
    if config.finetune:
        if algorithm.personal_models:
            raise FedrcError(
                f"--finetune: {algorithm.title} already scores clients with personal models"
            )
        tuning = executor
        if config.finetune_lr is not None:  # the same model and settings, another lr
            changed = dataclasses.replace(train_config, lr=config.finetune_lr)
            tuning = make_executor(changed, data, data.images.device)
        own = finetuned_logits(algorithm, tuning, models, data, train_config.seed)
    else:
        own = personal_logits(algorithm, executor, data, everyone)
    table = score_clients(logits, data, final["omega"], config.hard, own, everyone)
    if not config.unlabeled:
        return table, summarize(data, table), {}
    blind = unlabeled_omega(algorithm, logits, data, final["omega"])
    held = score_clients(logits, data, blind, config.hard, own, data.held_out)
    blind_summary = summarize(data, held + table * (held[:, 2:] == 0))  # others: as scored
    return (
        table,
        summarize(data, table),
        {
            "final_unlabeled_global_accuracy": blind_summary["global_accuracy"],
            "final_unlabeled_global_accuracy_by_concept": blind_summary[
                "global_accuracy_by_concept"
            ],
            "unlabeled_rule": algorithm.unlabeled_rule,
        },
    )


def _client_rows(data: FederatedData, table: torch.Tensor, omega: np.ndarray) -> list[dict]:
    """eval_clients.json: each client's description, accuracies and ω."""
    return [
        {
            "client_id": c.client_id,
            "participating": c.participating,
            "concept": c.concept,
            "style": c.style,
            "severity": c.severity,
            "train_accuracy": train,
            "test_accuracy": test,
            "omega": [round(float(w), 6) for w in omega[i]],
        }
        for i, (c, (train, test, _)) in enumerate(zip(data.clients, table.tolist()))
    ]


def plot_stage(config: PlotConfig) -> list[Path]:
    """plots/ in the run folder, which is held while it is drawn (`pipeline.common.run_lock`)."""
    with writer_lock(config.run, "--run", "fedrc plot", create=False):
        remove_leftovers(Path(config.run), [PLOTS])  # a killed plot's temporary folder
        foreign = foreign_plots(Path(config.run) / PLOTS)
        if foreign:
            raise FedrcError(
                f"--run: {Path(config.run) / PLOTS} holds files fedrc did not write "
                f"({first_few(foreign)}); `fedrc plot` replaces the folder whole: move them out"
            )
        return _plot(config)


def _plot(config: PlotConfig) -> list[Path]:
    from pipeline.outputs.plots import draw_all  # matplotlib is imported only when plotting
    from pipeline.outputs.style import FigureStyle

    run = Path(config.run)
    train_config = run_config(run)
    manifest = read_benchmark(Path(train_config.data))
    digest = check_benchmark(run, train_config.data, manifest)
    metrics = rf.read_metrics(run / rf.METRICS)
    identity = rf.run_identity(train_config, digest)
    clients, rounds = len(manifest.clients), rf.evaluated_rounds(metrics)
    k = num_models(train_config)
    assignments = read_assignments(run / rf.ASSIGNMENTS, identity, clients, rounds, k)
    label = ALGORITHMS.get(train_config.algorithm).label(train_config.algorithm_settings)
    folder = run.resolve().name  # runs/fedrc: "FedRC", not "FedRC (fedrc)"
    same = folder.lower() in (train_config.algorithm.lower(), label.lower())
    name = label if same else f"{label} ({folder})"
    last = max((r["round"] for r in metrics), default=0)
    sources = made_from(model_digest(run), last, digest)
    style = FigureStyle(tuple(config.format), font_size=config.font_size, dpi=config.dpi)
    return draw_all(run / PLOTS, metrics, assignments, manifest, name, style, sources)
