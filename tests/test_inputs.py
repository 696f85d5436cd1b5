"""What a user hands fedrc before anything runs (issue 40): params files, the command line,
YAML and paths. Every way they can be wrong is one line naming the file or the option, exit 2
(1 for memory), no traceback, no hang, nothing written; nothing given is silently ignored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_one_line
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.common import strict_yaml
from pipeline.config import read_params

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")
)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def check(text: str | bytes, name: str = "p.yaml"):
    """`fedrc check --params name` on a file holding `text`."""
    path = Path(name)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return invoke("check", "--params", name)


# ---- files that exist but cannot be read as params ----------------------------------------


@pytest.mark.parametrize(
    ("make", "culprits"),
    [
        (lambda: Path("p.yaml").mkdir(), ["--params: p.yaml: a folder, not a file"]),
        (lambda: os.mkfifo("p.yaml"), ["p.yaml", "not a regular file"]),  # would block a read
        (lambda: Path("p.yaml").write_bytes(b"train:\n  lr: \xff\xfe\n"), ["p.yaml", "not UTF-8"]),
        (lambda: Path("p.yaml").write_bytes("train: {out: é}\n".encode("latin-1")), ["UTF-8"]),
        (lambda: Path("p.yaml").symlink_to("p.yaml"), ["p.yaml", "symbolic links"]),
    ],
)
def test_a_params_file_that_cannot_be_read_is_one_line(here: Path, make, culprits) -> None:
    make()
    assert_one_line(invoke("check", "--params", "p.yaml"), *culprits, code=2)


def test_dev_null_as_params_is_not_called_missing(here: Path) -> None:
    line = assert_one_line(invoke("check", "--params", "/dev/null"), "/dev/null", code=2)
    assert "not found" not in line and "not a regular file" in line


def test_a_broken_params_yaml_here_breaks_no_command_that_does_not_read_it(here: Path) -> None:
    """The options' defaults in `--help` read ./params.yaml at import: a file that is not
    UTF-8 (or not YAML, or a folder) must not break `--version`, `info` or `--help`; the
    command that reads it names it."""
    for broken in (b"train:\n  lr: \xff\n", b"train: [1,\n", b"&a [*a]"):
        Path("params.yaml").write_bytes(broken)
        for args in (["--version"], ["info"], ["train", "--help"], ["partition", "--help"]):
            result = invoke(*args)
            assert result.exit_code == 0 and "Traceback" not in result.output, (args, broken)
        assert_one_line(invoke("check"), "params.yaml", code=2)
    Path("params.yaml").unlink()
    Path("params.yaml").mkdir()
    assert invoke("--version").exit_code == 0
    assert_one_line(invoke("check"), "params.yaml: a folder", code=2)


# ---- YAML: where the error is, and no expansion without bound ------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("train:\n  lr: 0.1\n  out: [1,\n", "line 4, column 1"),
        ("train:\n  lr: 0.1\n rounds: 3\n", "line 3, column 2"),
        ("train:\n\tlr: 0.1\n", "line 2, column 1"),
        ("partition: {clients: 3\n", "line 2, column 1"),
    ],
)
def test_a_yaml_syntax_error_gives_its_line(here: Path, text: str, where: str) -> None:
    assert_one_line(check(text), "p.yaml: not valid YAML", where, code=2)


@pytest.mark.parametrize(
    ("text", "culprits"),
    [
        (LAUGHS + "train: {lr: *h}\n", ["p.yaml", "more than 100,000 values"]),
        (LAUGHS.replace("x, x", "[x, x]") + "eval: {run: *g}\n", ["100,000 values"]),
        ("train: &t {lr: [*t]}\n", ["p.yaml", "refers to the node that holds it"]),
        ("a: &a [*a]\n", ["p.yaml", "refers to the node"]),
        ("train: " + "[" * 5000 + "]" * 5000 + "\n", ["p.yaml", "nested too deeply"]),
        ("train: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", ["p.yaml", "nested too deeply"]),
    ],
)
def test_yaml_that_would_expand_without_bound_is_refused_at_once(
    here: Path, text: str, culprits: list[str]
) -> None:
    started = time.perf_counter()
    line = assert_one_line(check(text), *culprits, code=2)
    assert time.perf_counter() - started < 10 and len(line) < 400


def test_aliases_within_the_bound_still_read(here: Path) -> None:
    Path("p.yaml").write_text("base: &b {lr: 0.05, rounds: 4}\ntrain: {<<: *b, seed: 1}\n")
    params = read_params(Path("p.yaml"))
    assert params["train"] == {"lr": 0.05, "rounds": 4, "seed": 1}
    with pytest.raises(strict_yaml.TooBig):
        strict_yaml.load(LAUGHS)


# ---- what a section or a key holds -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "culprits"),
    [
        ("train: false\n", ["p.yaml: train: expected a mapping, got False"]),
        ("train: []\n", ["train: expected a mapping, got []"]),
        ("train: 0\n", ["train: expected a mapping, got 0"]),
        ("partition: fmnist\n", ["partition: expected a mapping, got 'fmnist'"]),
        ("plot: [120]\n", ["plot: expected a mapping"]),
        ("per_algorithm: []\n", ["per_algorithm: expected a mapping"]),
        ("per_algorithm: {fedrc: 0.1}\n", ["per_algorithm.fedrc: expected a mapping"]),
        ("train: {fedrc: false}\n", ["train.fedrc: expected a mapping, got False"]),
        ("train: {cnn: [1]}\n", ["train.cnn: expected a mapping"]),
    ],
)
def test_a_section_that_is_not_a_mapping_is_refused_not_read_as_empty(
    here: Path, text: str, culprits: list[str]
) -> None:
    assert_one_line(check(text), *culprits, code=2)


def test_an_empty_section_is_still_empty(here: Path) -> None:
    for text in ("train:\n", "train: {}\n", "train: null\n", ""):
        result = check(text)
        assert result.exit_code == 0, (text, result.output)


@pytest.mark.parametrize(
    ("text", "culprits"),
    [
        ("train: {lrr: 0.1}\n", ["train.lrr: unknown key (did you mean 'lr'?)"]),
        ("train: {rouds: 3}\n", ["train.rouds", "did you mean 'rounds'?"]),
        ("partition: {clinets: 3}\n", ["partition.clinets", "did you mean 'clients'?"]),
        ("eval: {hardd: true}\n", ["eval.hardd", "did you mean 'hard'?"]),
        ("train: {fedrc: {estpe: adam}}\n", ["train.fedrc.estpe", "did you mean 'estep'?"]),
    ],
)
def test_an_unknown_key_gets_did_you_mean(here: Path, text: str, culprits: list[str]) -> None:
    assert_one_line(check(text), *culprits, code=2)


@pytest.mark.parametrize(
    ("sets", "culprits"),
    [
        (["estep=em", "estep=adam"], ["--set estep: given twice (estep=em, estep=adam)"]),
        (["estep=em", "fedrc.estep=em"], ["--set fedrc.estep: given twice"]),
        (["adam_lr=0.1", "fedrc.adam_lr=0.2"], ["given twice", "adam_lr=0.1"]),
        (["cnn.width=3"], ["--set cnn.width: unknown setting of cnn", "(known: normalize)"]),
        (["fedrc.estpe=adam"], ["--set fedrc.estpe", "did you mean 'estep'?"]),
        (["estpe=adam"], ["--set estpe", "did you mean 'estep'?"]),
    ],
)
def test_set_refuses_a_key_twice_and_unknown_dotted_keys(
    here: Path, sets: list[str], culprits: list[str]
) -> None:
    args = [x for item in sets for x in ("--set", item)]
    assert_one_line(invoke("train", "--algorithm", "fedrc", *args), *culprits, code=2)
    assert not Path("runs").exists()


# ---- values that pass their type and no use ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "culprits"),
    [
        ('train: {out: ""}\n', ["train.out: expected a path, not an empty string"]),
        ('train: {data: ""}\n', ["train.data: expected a path"]),
        ('eval: {run: ""}\n', ["eval.run: expected a path"]),
        ('partition: {out: "d\\0x"}\n', ["partition.out", "control characters"]),
        ('train: {out: "runs/a\\nb"}\n', ["train.out", "control characters"]),
        ('partition: {data_root: ""}\n', ["partition.data_root: expected a path"]),
        ("train: {lr: 1.0e+300}\n", ["train.lr", "at most 3.4e38", "float32"]),
        ("train: {lr: 10000000000000000000000000000000000000000000}\n", ["train.lr", "3.4e38"]),
        ("train: {algorithm: fedprox, fedprox: {mu: -1.0e+39}}\n", ["mu", "3.4e38"]),
    ],
)
def test_a_value_no_use_can_take_is_refused_by_check(
    here: Path, text: str, culprits: list[str]
) -> None:
    """`fedrc check` (the DVC pipeline's first stage) catches what a stage would fail on later:
    an empty path (partition `--out ''` once renamed the current folder), a NUL byte, a float
    that overflows float32 (`--lr 1e300` was an overflow traceback in the first round)."""
    line = assert_one_line(check(text), *culprits, code=2)
    assert "\n" not in line


@pytest.mark.parametrize(
    ("args", "culprits"),
    [
        (["partition", "--dataset", "synthetic", "--out", ""], ["partition.out", "empty"]),
        (["partition", "--dataset", "synthetic", "--out", "."], ["--out: .", "current folder"]),
        (["partition", "--dataset", "synthetic", "--out", ".."], ["--out: ..", "holds it"]),
        (["train", "--lr", "1e300"], ["train.lr", "float32"]),
        (["train", "--lr", "-1e39"], ["train.lr"]),
        (["eval", "--run", ""], ["eval.run", "empty"]),
    ],
)
def test_an_unusable_option_is_one_line_and_writes_nothing(
    here: Path, args: list[str], culprits: list[str]
) -> None:
    assert_one_line(invoke(*args), *culprits, code=2)
    assert sorted(p.name for p in here.iterdir()) == []


# ---- the command line itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "culprits"),
    [
        (["train", "--lr", "abc"], ["--lr", "fedrc train --help"]),
        (["train", "--lrr", "0.1"], ["No such option: --lrr"]),
        (["train", "--out"], ["--out", "requires an argument"]),
        (["check", "--params", "."], ["--params: .: a folder, not a file"]),
        (["nope"], ["nope"]),
        (["report", "r", "--dpi", "many"], ["--dpi"]),
    ],
)
def test_a_usage_error_is_one_line_not_a_box(args: list[str], culprits: list[str]) -> None:
    result = invoke(*args)
    line = assert_one_line(result, *culprits, code=2)
    assert "╭" not in result.output and line.startswith("Error: ")


def test_an_option_given_twice_keeps_the_last_as_most_tools_do(here: Path) -> None:
    """Scripts pass their defaults, then an override: `--lr 0.1 … --lr 0.05` is the later."""
    Path("p.yaml").write_text("train: {}\n")
    assert invoke("check", "--params", "p.yaml", "--params", "p.yaml").exit_code == 0


def test_output_to_a_file_or_a_pipe_is_not_cut_at_80_columns(here: Path) -> None:
    out = "runs/" + "a-long-run-name-" * 6
    Path("params.yaml").write_text(f"train: {{out: {out}}}\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "fedrc_cli", "check"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"→ {out})"), lines


# ---- what the machine refuses: memory, plugins ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["partition", "--dataset", "synthetic", "--out", "d"], "--replicate"),
        (["check"], "free some memory"),
    ],
)
def test_out_of_memory_names_the_commands_own_options(
    here: Path, monkeypatch, args: list[str], hint: str
) -> None:
    import pipeline.stages as stages

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(stages, "partition_stage", no_memory)
    monkeypatch.setattr(stages, "check_stage", no_memory)
    line = assert_one_line(invoke(*args), "out of memory", hint, code=1)
    assert "--clusters" not in line and "--batch-size" not in line


def test_torch_that_cannot_be_mapped_under_a_memory_limit_is_one_line(here: Path) -> None:
    """Under `ulimit -v` the loader cannot map libtorch: an ImportError of the first command
    that imports torch (here: train), named as memory, exit 1."""
    resource = pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1_200_000_000, 1_200_000_000))

    command = [sys.executable, "-m", "fedrc_cli", "train", "--device", "cpu", "--out", "r"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=limit)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("Error: out of memory loading torch") and "ulimit -v" in lines[0]


@pytest.mark.parametrize(
    ("body", "culprits", "code"),
    [
        ("import sys\nsys.exit(3)\n", ["exits:X", "sys.exit(3) on import"], 2),
        ("raise SystemExit('bye')\n", ["exits:X", "sys.exit('bye')"], 2),
        ("raise KeyboardInterrupt\n", ["interrupted while importing", "exits:X"], 130),
    ],
)
def test_a_plugin_that_exits_or_is_interrupted_at_import_is_named(
    here: Path, monkeypatch, body: str, culprits: list[str], code: int
) -> None:
    Path("exits.py").write_text(body)
    monkeypatch.syspath_prepend(str(here))
    monkeypatch.delitem(sys.modules, "exits", raising=False)
    for args in (["info", "exits:X"], ["train", "--algorithm", "exits:X"]):
        assert_one_line(invoke(*args), *culprits, code=code)
        sys.modules.pop("exits", None)


# ---- nothing given is ignored: --data-root, concepts ---------------------------------------


@pytest.mark.parametrize("dataset", ["synthetic", "sine", "sea"])
def test_a_data_root_the_dataset_would_ignore_is_refused(here: Path, dataset: str) -> None:
    Path("mine").mkdir()
    args = ["partition", "--dataset", dataset, "--data-root", "mine", "--out", "d"]
    assert_one_line(invoke(*args), "--data-root", f"{dataset} reads no files", code=2)
    Path("p.yaml").write_text(f"partition: {{dataset: {dataset}, data_root: mine}}\n")
    assert_one_line(invoke("check", "--params", "p.yaml"), "--data-root", code=2)


def test_a_data_root_without_the_dataset_never_falls_back_to_the_system_copy(
    here: Path, monkeypatch
) -> None:
    """Given `--data-root`, fmnist is looked for there only (then downloaded there): the
    system's copy would be another dataset than the path the run records."""
    import pipeline.data.loaders.idx as idx

    looked: list[Path] = []
    real = idx._idx_from

    def spy(name: str, directory: Path):
        looked.append(Path(directory))
        return real(name, directory)

    def offline(name: str, root: Path) -> None:
        raise OSError("no network")

    monkeypatch.setattr(idx, "_idx_from", spy)
    monkeypatch.setattr(idx, "_download", offline)
    Path("empty").mkdir()
    args = ["partition", "--dataset", "fmnist", "--data-root", "empty", "--clients", "4"]
    assert_one_line(invoke(*args, "--out", "d"), "--data-root", "not found in empty", code=2)
    assert looked == [Path("empty")] and not Path("d").exists()


@pytest.mark.parametrize(
    ("concepts", "culprits"),
    [
        ("identity,reverse,shift:0", ["'shift:0' changes no label", "identity"]),
        ("shift:10,reverse", ["'shift:10' changes no label with 10 classes"]),
        ("identity,pair_flip:0", ["'pair_flip:0' changes no label"]),
        ("swap:1-2,swap:2-1", ["'swap:2-1' maps the labels as 'swap:1-2' does"]),
        ("shift:1,shift:11", ["'shift:11' maps the labels as 'shift:1'"]),
        ("pair_flip:0.2,pair_flip:0.20", ["'pair_flip:0.20' maps the labels as"]),
    ],
)
def test_concepts_that_map_labels_alike_are_refused(
    here: Path, concepts: str, culprits: list[str]
) -> None:
    args = ["partition", "--dataset", "synthetic", "--concepts", concepts, "--out", "d"]
    assert_one_line(invoke(*args), "partition.concepts", *culprits, code=2)
    listed = ", ".join(concepts.split(","))
    Path("p.yaml").write_text(f"partition: {{dataset: synthetic, concepts: [{listed}]}}\n")
    assert_one_line(invoke("check", "--params", "p.yaml"), *culprits, code=2)
    assert not Path("d").exists()


def test_distinct_concepts_still_partition(here: Path) -> None:
    args = ["partition", "--dataset", "synthetic", "--clients", "6", "--samples-per-client"]
    args += ["40", "--holdout-samples", "30", "--concepts", "identity,shift:2,swap:1-2"]
    result = invoke(*args, "--out", "d")
    assert result.exit_code == 0, result.output
    shutil.rmtree("d")
