"""`fedrc info [FOLDER | NAME]`: describe a built benchmark (clients per concept and style, sizes,
label heterogeneity) as rich tables, or as JSON with --json; with a component's name, its
settings; with nothing, every algorithm, model and dataset there is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table

from fedrc_cli.common import console, user_errors
from pipeline.data.describe import describe
from pipeline.data.meaning import read_benchmark


def info(
    folder: Annotated[
        str | None,
        typer.Argument(
            help="A `fedrc partition` output folder, or an algorithm, model or dataset name.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the description as JSON instead of tables.")
    ] = False,
) -> None:
    """Describe a benchmark (who has which concept and style, sizes, label shift), a component's
    settings, or, with no argument, list the algorithms, models and datasets."""
    with user_errors():
        if (folder is None or not Path(folder).is_dir()) and show_component(folder):
            return
        description = describe(read_benchmark(Path(folder), option="FOLDER"))
    if as_json:
        typer.echo(json.dumps(description, indent=2))
    else:
        console.print(render(description))


def show_component(name: str | None) -> bool:
    """Print every component (no name) or the settings of the one called `name`; False when
    there is none of that name. The built-ins are read from their cards, without torch; a
    plugin is checked by importing it, which may import torch."""
    from fedrc_cli.catalog import catalog, find, settings_table

    if name is None:
        console.print(catalog())
        return True
    found = find(name)
    if found is None:
        return False
    console.print(settings_table(name, *found))
    return True


def render(d: dict[str, Any]) -> Group:
    """Two tables: participating clients by style × concept, then the benchmark's numbers."""
    by_concept = d["clients_by_concept_and_style"]
    styles = sorted(
        {s for counts in by_concept.values() for s in counts}, key=lambda s: s != "none"
    )
    shape = "×".join(str(x) for x in d["image_shape"])
    clients = Table(
        title=f"{d['dataset']} ({shape}, {d['num_classes']} classes): "
        f"{d['participating']} participating clients by style and concept"
    )
    clients.add_column("style")
    for name in by_concept:
        clients.add_column(name, justify="right")
    clients.add_column("total", justify="right")
    for style in styles:
        row = [by_concept[name].get(style, 0) for name in by_concept]
        clients.add_row(style, *map(str, row), str(sum(row)))

    sizes, het = d["samples_per_client"], d["label_heterogeneity"]
    cpc = het["classes_per_client"]
    numbers = Table(show_header=False, title="benchmark")
    numbers.add_column("what")
    numbers.add_column("value")
    rows = [
        ("shifts", ", ".join(d["shifts"]) or "none"),
        (
            "label split",
            d["label_split"] + (f" ({d['label_groups']} groups)" * bool(d["label_groups"])),
        ),
        (
            "samples per client",
            f"{sizes['min']} / {sizes['median']:g} / {sizes['max']} (min / median / max)",
        ),
        ("samples in all", str(sizes["total"])),
        ("classes per client", f"{cpc['mean']:g} ({cpc['min']}–{cpc['max']})"),
        ("label distance (mean pairwise TV)", f"{het['mean_pairwise_tv']:.3f}"),
        (
            "held-out clients",
            ", ".join(
                f"{h['concept']} ({h['style']}, {h['samples']})" for h in d["held_out_clients"]
            ),
        ),
        ("seed", str(d["seed"])),
        ("content hash", d["content_hash"][:16] + "…"),
    ]
    for what, value in rows:
        numbers.add_row(what, value)
    if "drift" not in d:
        return Group(clients, numbers)
    return Group(clients, numbers, drift_table(d["drift"]))


def drift_table(drift: dict[str, Any]) -> Table:
    """The schedule, a row per time step: clients per concept and who drifted."""
    table = Table(title=f"drift over {drift['time_steps']} time steps ({drift['schedule']})")
    table.add_column("step", justify="right")
    names = list(drift["steps"][0]["clients_by_concept"])
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("drifted (recurring / new)")
    for step in drift["steps"]:
        moved = step["drifted"]
        shown = ", ".join(map(str, moved[:8])) + (f" … ({len(moved)})" if len(moved) > 8 else "")
        what = f"{shown} ({step['recurring']} / {step['new']})" if moved else "–"
        counts = [str(step["clients_by_concept"][n]) for n in names]
        table.add_row(str(step["step"]), *counts, what)
    return table
