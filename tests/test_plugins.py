"""Components from outside fedrc (entry points, module:Name), per-algorithm settings through
params.yaml and --set, their descriptions in `fedrc info NAME`, and runs written before
settings existed."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from fedrc_cli.app import app
from fedrc_cli.catalog import settings_table
from pipeline.algorithms import ALGORITHMS
from pipeline.algorithms import BUILT_IN as BUILT_IN_ALGORITHMS
from pipeline.common.errors import FedrcError
from pipeline.common.settings import description
from pipeline.models import BUILT_IN as BUILT_IN_MODELS
from pipeline.models import MODELS
from pipeline.run import files as rf
from pipeline.run.resolve import from_values, make_config, train_config

PLUGIN = '''
from dataclasses import dataclass

import torch

from pipeline.algorithms.fedem import FedEM
from pipeline.common.settings import Settings, require


@dataclass(frozen=True)
class TemperedSettings(Settings):
    temperature: float = 2.0

    def validate(self) -> None:
        require(self.temperature > 0, "temperature", "a number > 0", self.temperature)


class Tempered(FedEM):
    """FedEM with the losses divided by a temperature before the E-step."""

    name = "tempered"
    title = "Tempered FedEM"
    paper = "a test plugin"
    Settings = TemperedSettings

    def assign(self, client, losses, labels):
        return super().assign(client, losses / self.settings.temperature, labels)
'''
FAST = ["--rounds", "1", "--local-epochs", "1", "--batch-size", "16", "--clusters", "2"]


@pytest.fixture
def plugin_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed-looking distribution `tempered-fedem` (a .dist-info folder on sys.path)
    with one good and one broken entry point in group fedrc.algorithms."""
    site = tmp_path / "site"
    (site / "tempered_fedem").mkdir(parents=True)
    (site / "tempered_fedem" / "__init__.py").write_text(PLUGIN)
    info = site / "tempered_fedem-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tempered-fedem\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[fedrc.algorithms]\ntempered = tempered_fedem:Tempered\nbroken = no_such_module:Thing\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    yield site
    sys.modules.pop("tempered_fedem", None)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_error(result, *culprits: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    for culprit in culprits:
        assert culprit in lines[0], result.output


def test_an_entry_point_algorithm_is_listed_configured_and_trained(
    plugin_package: Path, tiny_data: Path
) -> None:
    listing = invoke("info")
    assert listing.exit_code == 0, listing.output
    assert "tempered" in listing.output and "tempered-fedem 0.3" in listing.output
    assert "no_such_module" in listing.output  # the broken one: its line says why
    assert "temperature" in invoke("info", "tempered").output

    config = train_config({"train": {"algorithm": "tempered", "tempered": {"temperature": 4}}})
    assert config.algorithm_settings.temperature == 4.0
    assert ALGORITHMS.get("tempered").title == "Tempered FedEM"

    run = invoke(
        "train", "--data", str(tiny_data), "--algorithm", "tempered", *FAST,
        "--set", "temperature=3", "--out", "r",
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    saved = json.loads(Path("r/config.json").read_text())
    assert saved["settings"]["tempered"] == {"temperature": 3.0}
    assert invoke("eval", "--run", "r").exit_code == 0


def test_each_built_in_algorithm_class_is_its_card() -> None:
    """`fedrc info` reads the cards, a run uses the classes: the same name, title, paper and
    settings (a card naming the wrong class fails here)."""
    for name, card in BUILT_IN_ALGORITHMS.items():
        cls = ALGORITHMS.get(name)
        assert (cls.name, cls.title, cls.paper) == (card.name, card.title, card.paper)
        assert cls.Settings is card.Settings


def test_every_built_in_setting_says_what_it_does() -> None:
    """Each built-in algorithm's and model's setting has a one-line description, and
    `fedrc info NAME` shows it in its own column."""
    components = [(ALGORITHMS, a, a.Settings) for a in BUILT_IN_ALGORITHMS.values()]
    components += [(MODELS, m, m.settings) for m in BUILT_IN_MODELS.values()]
    checked = 0
    for registry, component, settings in components:
        name = component.name
        table = Console(width=400, record=True)
        table.print(settings_table(name, registry, component))
        shown = table.export_text()
        assert "description" in shown
        for item in dataclasses.fields(settings):
            text = description(item)
            assert text and "\n" not in text, f"{name}.{item.name}"
            assert text in shown, f"{name}.{item.name}"
            checked += 1
    assert checked >= 30  # every algorithm's settings were seen, not an empty loop


def test_a_plugin_without_descriptions_lists_its_settings(plugin_package: Path) -> None:
    listing = invoke("info", "tempered")
    assert listing.exit_code == 0, listing.output
    assert "temperature" in listing.output and "2.0" in listing.output


def test_a_broken_plugin_is_one_line_where_named_and_harmless_elsewhere(
    plugin_package: Path, tiny_data: Path
) -> None:
    broken = invoke("train", "--data", str(tiny_data), "--algorithm", "broken", "--out", "r")
    one_line_error(broken, "plugin 'broken'", "no_such_module:Thing", "ModuleNotFoundError")
    fine = invoke("train", "--data", str(tiny_data), "--algorithm", "fedavg", *FAST, "--out", "f")
    assert fine.exit_code == 0, fine.output


def test_a_module_that_is_not_installed_is_named_module_colon_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_data: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_method.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = invoke(
        "train", "--data", str(tiny_data), "--algorithm", "my_method:Tempered", *FAST, "--out", "r"
    )
    assert run.exit_code == 0, run.output
    one_line_error(invoke("train", "--algorithm", "my_method:Nope", "--out", "x"), "my_method:Nope")
    sys.modules.pop("my_method", None)


@pytest.mark.parametrize(
    ("sets", "culprit"),
    [
        (["estep"], "--set estep: expected KEY=VALUE"),
        (["temperature=2"], "--set temperature: unknown setting for algorithm fedrc (estep"),
        (["adam_lr=fast"], "--set fedrc.adam_lr: expected a number, got 'fast'"),
        (["lr=0.1"], "--set lr: a shared option; give it as --lr"),
        (["cfl.cfl_eps1=1"], "--set cfl.cfl_eps1: cfl is neither the algorithm (fedrc)"),
        (["adam_lr=-1"], "train.fedrc.adam_lr: expected a number > 0"),
    ],
)
def test_set_errors_name_the_key_the_component_and_what_is_expected(sets, culprit) -> None:
    with pytest.raises(FedrcError) as error:
        train_config({}, {}, sets)
    assert culprit in str(error.value)


def test_settings_come_from_params_then_per_algorithm_then_set() -> None:
    params = {
        "train": {"algorithm": "cfl", "cfl": {"cfl_eps1": 0.5, "max_clusters": 4}},
        "per_algorithm": {"cfl": {"max_clusters": 3, "lr": 0.05}},
    }
    config = train_config(params, {}, ["cfl_eps2=2"])
    settings = config.algorithm_settings
    assert (settings.cfl_eps1, settings.max_clusters, settings.cfl_eps2) == (0.5, 3, 2.0)
    assert config.lr == 0.05
    # a paper's value is the default: FedSoft runs without being told μ
    assert train_config({}, {"algorithm": "fedsoft"}).algorithm_settings.mu == 0.1
    with pytest.raises(FedrcError, match=r"train\.estep: a setting of one algorithm or model"):
        train_config({"train": {"estep": "adam"}})


def legacy_files(run: Path) -> None:
    """Rewrite a run's config.json and checkpoint identities as fedrc wrote them before
    settings existed: every option flat, every algorithm's among them at its old default."""
    old_defaults = {
        "pretrained": False, "norm": "batch", "mu": 0.0, "max_clusters": None,
        "cfl_eps1": 0.4, "cfl_eps2": 1.6, "warmup_rounds": 0, "label_floor": 1e-8,
        "heldout_label_prior": True, "estep": "em", "adam_lr": 1.0, "adam_beta1": 0.9,
        "adam_beta2": 0.99, "adam_eps": 1e-8, "prune_threshold": None, "hard_train": False,
        "table_noise": 0.0, "shared_body": False,
    }  # fmt: skip
    config = json.loads((run / rf.CONFIG).read_text())
    settings = config.pop("settings")
    flat = {**old_defaults, **config}
    for values in settings.values():
        flat.update(values)
    (run / rf.CONFIG).write_text(json.dumps(flat))
    for name in (rf.MODEL, rf.CHECKPOINT):
        state = torch.load(run / name, weights_only=False)
        identity = {k: v for k, v in json.loads(state["identity"]).items() if "." not in k}
        for key in ("precision", "prune_after", "merge_gap"):
            identity.pop(key, None)  # added later; left out at their defaults back then
        identity.update({k: v for k, v in flat.items() if k in old_defaults})
        state["identity"] = json.dumps(identity, sort_keys=True)
        state.pop("checksum", None)  # sealed files came later
        torch.save(state, run / name)


def test_a_run_from_before_settings_still_evaluates_and_resumes(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ("--data", str(tiny_data), "--algorithm", "cfl", *FAST, "--set", "max_clusters=2")
    assert invoke("train", *args, "--out", "old").exit_code == 0
    legacy_files(Path("old"))
    saved = json.loads(Path("old/config.json").read_text())
    saved.pop("data_digest")
    assert from_values(saved).identity() == (
        make_config(data=str(tiny_data), algorithm="cfl", max_clusters=2, rounds=1,
                    local_epochs=1, batch_size=16, clusters=2, out="old").identity()
    )  # fmt: skip
    assert invoke("eval", "--run", "old").exit_code == 0
    resumed = invoke("train", "--out", "old", "--rounds", "2", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert [r["round"] for r in rf.read_metrics(Path("old") / rf.METRICS)] == [1, 2]
