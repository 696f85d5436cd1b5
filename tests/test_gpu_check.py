"""`benchmarks/gpu_check.sh --dry-run`: every step of the GPU check at toy size on the CPU, so
that the script a GPU session runs first cannot rot where no GPU is lent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 5 to 11 minutes; .ci/run runs the dry run itself, this checks its output too
def test_gpu_check_dry_run_prints_every_table() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--budget-min", "12"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "skipped" in out  # the cuda tests were collected (and skipped on the CPU)
    assert "# Profile of fedrc" in out and "| client_parts |" in out  # gpu_profile.py
    assert "| --together 2 |" in out  # together.py
    assert out.count("| executor | s / round |") == 2  # FMNIST CNN and CIFAR-10 MobileNetV2
    assert "| im2col |" in out  # conv_paths.py
    assert "| compiled |" in out and "compiled against eager: loss sums within" in out
    assert "mobilenet_v2" in out and "| fedrc | 4 | 16 |" in out and "| ifca | 2 | 32 |" in out
    # the matrix: stopped with a checkpoint, resumed from it on the same machine, started over
    # on a fresh one, and finished with FedRC-FT and the report
    assert len(re.findall(r"stopped \(train, round [23]/4\)", out)) == 2  # past round 2's
    assert "train from round 2" in out
    fresh = out[out.index("on a fresh machine") :]
    assert "train from round 0" in fresh and "done: 21 of 21 steps; failed: none" in fresh
    assert out.count(": finetune") == 4 and "fedrc report: report/report.md" in out
    # the lr grid and IFCA as released: seed 1 starts at the lr seed 0 picked for each
    found = re.findall(
        r"lr picked on seed 0: fedrc (\S+), ifca (\S+), ifca as released (\S+)\n", out
    )
    assert found, out[-1500:]
    for name, lr in zip(("fedrc", "ifca", "ifca-released"), found[-1]):
        first = re.search(rf"^{name}-lr(\S+)-s1: train from", out, re.MULTILINE)
        assert first and first.group(1) == lr
    assert out.rstrip().endswith("dry run: every step ran, --continue included")


# ---- the parts of the check that need no GPU and no child process --------------------------


def event(name: str, start: float, end: float, device: str = "cuda") -> object:
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    kind = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
    return SimpleNamespace(name=name, device_type=kind, time_range=span, self_cpu_time_total=0)


def test_the_profile_counts_device_work_not_its_own_labels() -> None:
    from benchmarks.gpu_profile import device_summary, gaps, host_summary, union

    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert gaps([(0, 3), (5, 8), (20, 21)]) == [2, 12]
    events = [  # one round of 100 us: two kernels, a copy, and the labels the script adds
        event("phase::client_parts", 0, 100), event("inner::executor.logits", 0, 50),
        event("gemm", 10, 30), event("relu", 30, 33), event("Memcpy HtoD (Pageable)", 60, 70),
        event("phase::client_parts", 0, 100, "cpu"), event("cudaStreamSynchronize", 40, 45, "cpu"),
    ]  # fmt: skip
    text = "\n".join(device_summary(events, wall_us=100, rounds=1, top=5))
    assert "GPU busy 0.0 ms a round of 0.1 ms wall (33.0 %); 2 kernels a round" in text
    assert "phase::" not in text and "inner::" not in text
    assert "| gemm | 1.0 | 0.02 | 20.0 | 60.6 |" in text
    assert "| Memcpy HtoD | 1.0 | 0.01 |" in text
    host = "\n".join(host_summary(events, rounds=1, top=5))
    assert "| cudaStreamSynchronize | 1.0 | 0.01 |" in host
    assert "| client_parts |" in host and "| 33 % |" in host  # 33 of its 100 us busy


def test_the_profile_runs_on_the_cpu(tiny_data: Path, capsys) -> None:
    from benchmarks.gpu_profile import main

    main(["--data", str(tiny_data), "--device", "cpu", "--warmup", "1", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "No device activity was recorded" in out
    assert "| client_parts |" in out and "| executor.train |" in out
    assert "pipeline/run/training.py" in out  # the cProfile of one round


def test_a_training_is_stopped_when_its_next_save_cannot_be_written_in_time() -> None:
    from benchmarks.gpu_trials import must_stop

    # round 10 of 200, a checkpoint every 25 rounds, 2 s a round, a 30 s checkpoint write
    assert not must_stop(0, 100, 10, 200, 25, 2.0, 30.0)  # round 25 at 30 s + 30 s < 100
    assert must_stop(0, 50, 10, 200, 25, 2.0, 30.0)  # 60 s > 50: the work would be lost
    assert must_stop(100, 100, 10, 200, 25, 2.0, 30.0)  # the deadline
    assert not must_stop(0, 50, 195, 200, 25, 2.0, 30.0)  # the end of the run saves too
    assert not must_stop(0, 50, 10, 200, 25, None, 30.0)  # no estimate: wait for the deadline


def test_a_run_that_fits_writes_no_checkpoint_before_its_end() -> None:
    from benchmarks.gpu_trials import checkpoint_every

    assert checkpoint_every(0, 200, 1.0, 400, 25) == 200  # 200 s × 1.25 < 400 s
    assert checkpoint_every(100, 200, 2.0, 400, 25) == 200
    assert checkpoint_every(0, 200, 2.0, 400, 25) == 25
    assert checkpoint_every(0, 200, None, 4000, 25) == 25


def test_a_restarted_training_is_timed_from_its_own_lines(tmp_path: Path) -> None:
    """The log of a trial grows over its starts; a resumed training's first round must not be
    timed from the last line an earlier start wrote (it read 13 s a round for 4.5 s on a GPU)."""
    import time

    from benchmarks.gpu_trials import Job, Trial

    log = tmp_path / "fedrc-s0.log"
    log.write_text("round 1/200  loss 1.6\nround 2/200  loss 1.6\nround 3/200  loss 1.6\n")
    script = (  # a start-up of 1.2 s, then a round every 0.3 s
        "import time\nfor r, s in ((4, 1.2), (5, 0.3), (6, 0.3)):\n"
        "    time.sleep(s)\n    print(f'round {r}/200 ', flush=True)"
    )
    job = Job(Trial("fedrc", 0), tmp_path, dict(os.environ), 200, 25,
              lambda resume, every: [sys.executable, "-c", script], lambda run, ft: [])  # fmt: skip
    job.start("train", log)
    while job.command.poll() is None:
        job.watch(time.monotonic(), 1)
        time.sleep(0.05)
    job.watch(time.monotonic(), 1)
    assert job.round == 6
    assert [r.number for r in job.rounds_seen] == [5, 6]  # round 4's gap includes the start
    assert all(r.gap_s < 1.0 for r in job.rounds_seen)


def test_rounds_faster_than_the_reads_are_timed_by_their_count(tmp_path: Path) -> None:
    """Read once a second, rounds of 0.34 s arrive two or three at a time; the median of single
    gaps read them as 1 s (a paper-scale FedAvg on the H100)."""
    from benchmarks.gpu_trials import Job, Round, Trial

    job = Job(Trial("fedavg", 0), tmp_path, {}, 200, 25, lambda r, e: [], lambda r, f: [])
    job.rounds_seen = [
        Round(3, 1.0, (1, 1), False, 3), Round(6, 1.0, (1, 1), False, 3),
        Round(8, 0.68, (1, 1), False, 2), Round(25, 5.0, (1, 1), True, 3),
        Round(28, 1.0, (2, 2), False, 2),
    ]  # fmt: skip
    assert job.seconds_per_round(1) == pytest.approx(2.68 / 8)
    assert job.seconds_per_round() == pytest.approx(3.68 / 10)
    assert job.checkpoint_s() == pytest.approx(5.0 - 3 * 0.368)


def test_how_many_trials_at_once() -> None:
    from benchmarks.gpu_trials import how_many, keep_together

    gpu = {"util": 30.0, "used_mib": 10_000.0, "total_mib": 80_000.0}
    assert how_many(gpu, 0, 0, 4) == 3  # 90 % / 30 %
    assert how_many({**gpu, "util": 85.0}, 0, 0, 4) == 1  # busy already
    assert how_many({**gpu, "used_mib": 35_000.0}, 0, 0, 4) == 2  # GPU memory
    assert how_many(gpu, 16 * 2**30, 20 * 2**30, 4) == 2  # the disk holds one more run
    assert how_many(None, 0, 0, 4) == 2  # no reading: try two
    assert keep_together(1.0, 1.5, 2)  # 2 rounds per 1.5 s against 1 per s
    assert not keep_together(1.0, 1.9, 2)  # 5 % faster is not worth it


def test_a_damaged_state_is_one_line(tmp_path: Path) -> None:
    from benchmarks.gpu_results import STATE, State, read_state, write_state
    from pipeline.common.errors import FedrcError

    write_state(tmp_path, State(plan={"seeds": [0]}, budget_s=60.0, done=["cuda-tests"]))
    assert read_state(tmp_path).done == ["cuda-tests"]
    for text, says in [("{", "not valid JSON"), ('{"format": 1, "plan": 3}', "'plan'"),
                       ("[]", "format 1")]:  # fmt: skip
        (tmp_path / STATE).write_text(text)
        with pytest.raises(FedrcError, match=says) as e:
            read_state(tmp_path)
        assert str(tmp_path / STATE) in str(e.value) and "\n" not in str(e.value)


def test_continue_without_a_state_and_a_second_start_are_refused(tmp_path: Path, capsys) -> None:
    from benchmarks.gpu_check import main

    results = tmp_path / "r"
    args = ["--dry-run", "--results", str(results), "--work", str(tmp_path / "w")]
    assert main([*args, "--continue"]) == 2
    assert "start without --continue" in capsys.readouterr().err
    results.mkdir()
    (results / "state.json").write_text("{}")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--continue" in err and str(results) in err
    assert main([*args, "--budget-min", "0"]) == 2


def test_a_run_kept_without_its_model_still_reports(tiny_data: Path, tmp_path: Path) -> None:
    """keep_run copies the small files and model.sha256: fedrc report reads the copy as it reads
    the run, and refuses a model.sha256 that is not a digest."""
    from conftest import TINY_TRAIN
    from typer.testing import CliRunner

    from benchmarks.gpu_results import keep_run
    from fedrc_cli.app import app
    from pipeline.config import EvalConfig
    from pipeline.run.resolve import make_config
    from pipeline.stages import eval_stage, train_stage

    run = tmp_path / "full" / "fedrc-s0"
    config = dict(TINY_TRAIN, rounds=2, data=str(tiny_data), algorithm="fedrc", out=str(run))
    train_stage(make_config(**config))
    eval_stage(EvalConfig(run=str(run)))
    results = tmp_path / "kept"
    keep_run(run, results)
    kept = results / "runs" / "fedrc-s0"
    assert not (kept / "model.pt").exists() and (kept / "model.sha256").is_file()
    runner = CliRunner()
    full = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "a")])
    copy = runner.invoke(app, ["report", str(kept), "--out", str(tmp_path / "b")])
    assert full.exit_code == 0 and copy.exit_code == 0, full.output + copy.output
    tables = [(tmp_path / name / "report.csv").read_text() for name in ("a", "b")]
    assert tables[0] == tables[1]
    (kept / "model.sha256").write_text("not a digest\n")
    bad = runner.invoke(app, ["report", str(kept), "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "model.sha256" in bad.output, bad.output
    (kept / "model.sha256").unlink()
    gone = runner.invoke(app, ["report", str(kept), "--out", str(tmp_path / "c")])
    assert gone.exit_code == 2 and "is gone" in gone.output, gone.output


# ---- the matrix under the fair protocol (benchmarks/gpu_plan.py) ---------------------------


def kept(runs: Path, name: str, lr: float, train: float | None = None) -> None:
    """A kept run's small files, as far as the plan reads them."""
    (runs / name).mkdir(parents=True)
    (runs / name / "config.json").write_text(
        json.dumps({"algorithm": name.split("-")[0], "lr": lr})
    )
    if train is not None:
        (runs / name / "eval.json").write_text(json.dumps({"train_accuracy": train}))


def test_the_grid_has_every_lr_and_the_baselines_as_released() -> None:
    from benchmarks.gpu_plan import grid, has_released

    trials = grid(["fedrc", "fedavg", "ifca"], [0, 1], [0.1, 0.03], True, {"fedrc"})
    names = {t.name for t in trials}
    assert len(trials) == 2 * 2 * 4  # fedrc, fedavg, ifca, IFCA as released
    assert "ifca-released-lr0.03-s1" in names and not any("fedavg-released" in n for n in names)
    assert all(t.finetune == (t.algorithm == "fedrc") for t in trials)
    legacy = {t.legacy for t in trials} - {None}
    assert legacy == {"fedrc-s0", "fedrc-s1", "fedavg-s0", "fedavg-s1", "ifca-s0", "ifca-s1"}
    table1 = ("fedavg", "ifca", "cfl", "fesem", "fedem", "fedrc", "fedsoft")
    assert [a for a in table1 if has_released(a)] == ["ifca", "cfl", "fesem", "fedsoft"]


def test_seed_0_runs_every_lr_then_the_other_seeds_at_its_pick(tmp_path: Path) -> None:
    """IFCA's seed-0 runs: lr 0.1 (a first-plan run, `ifca-s0`) trains to 0.70, lr 0.03 to
    0.80: the pick is 0.03, so seed 1 runs at 0.03 before 0.1. IFCA as released has no seed-0
    run yet: no pick, its seed 1 waits with the rest. FedSoft, too slow for one command, last."""
    from benchmarks.gpu_plan import grid, picks, priority

    runs = tmp_path / "runs"
    kept(runs, "ifca-s0", 0.1, 0.70)
    kept(runs, "ifca-lr0.03-s0", 0.03, 0.80)
    trials = grid(["ifca", "fedsoft"], [0, 1], [0.1, 0.03], True, set())
    settled = {"ifca-s0", "ifca-lr0.03-s0"}
    chosen = picks(trials, settled, runs, 0)
    assert chosen == {("ifca", False): 0.03}
    left = [t for t in trials if t.name not in settled and t.legacy not in settled]
    order = ["ifca", "fedsoft"]
    ranked = sorted(left, key=lambda t: priority(t, chosen, 0, [0.1, 0.03], order, {"fedsoft"}))
    assert [t.name for t in ranked] == [
        "ifca-released-lr0.1-s0", "ifca-released-lr0.03-s0",  # the rest of seed 0
        "ifca-lr0.03-s1",  # seed 1 at the pick
        "ifca-lr0.1-s1", "ifca-released-lr0.1-s1", "ifca-released-lr0.03-s1",
        "fedsoft-lr0.1-s0", "fedsoft-released-lr0.1-s0", "fedsoft-lr0.03-s0",
        "fedsoft-released-lr0.03-s0", "fedsoft-lr0.1-s1", "fedsoft-released-lr0.1-s1",
        "fedsoft-lr0.03-s1", "fedsoft-released-lr0.03-s1",
    ]  # fmt: skip


def first_plan(results: Path, done: list[str]) -> list[str]:
    """A first-plan (no lr grid) dry-run state over IFCA, seed 0; the check's --list args."""
    from benchmarks.gpu_results import State, write_state

    plan = {"dry_run": True, "device": "cpu", "clients": 6, "rounds": 4, "seeds": [0],
            "algorithms": ["ifca"]}  # fmt: skip
    write_state(results, State(plan=plan, budget_s=300.0, done=done))
    return ["--dry-run", "--results", str(results), "--seeds", "0", "--algorithms", "ifca",
            "--lrs", "0.1", "0.03", "--work", str(results.parent / "w")]  # fmt: skip


def test_a_first_plan_state_goes_on_with_its_runs_as_the_lr_0_1_trials(
    tmp_path: Path, capsys
) -> None:
    from benchmarks.gpu_check import main

    results = tmp_path / "results"
    kept(results / "runs", "ifca-s0", 0.1, 0.7)
    args = first_plan(results, ["cuda-tests", "ifca-s0"])
    assert main([*args, "--list"]) == 0
    out = capsys.readouterr().out
    assert "lr picked on seed 0: none yet" in out  # IFCA's lr 0.03 is still to run
    listed = re.findall(r"\| \d+ \| (\S+) \|", out)
    assert listed == ["ifca-released-lr0.1-s0", "ifca-lr0.03-s0", "ifca-released-lr0.03-s0"]
    (results / "runs" / "ifca-s0" / "config.json").write_text('{"lr": 0.06}')
    assert main([*args, "--continue"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ifca-s0/config.json: lr 0.06, not the first plan's 0.1" in err


def test_the_gpu_results_of_the_first_plan_go_on_under_the_lr_grid(capsys) -> None:
    """The committed results folder (begun under the first plan: seed 0 at lr 0.1) is continued,
    not started over: its first-plan runs are this plan's correct lr-0.1 trials."""
    from benchmarks.gpu_check import main
    from benchmarks.gpu_plan import grid
    from benchmarks.gpu_results import read_state

    results = ROOT / "experiments" / "fmnist" / "results" / "gpu-300clients-200rounds"
    assert main(["--list", "--results", str(results)]) == 0
    listed = re.findall(r"\| \d+ \| (\S+) \|", capsys.readouterr().out)
    table1 = ["fedrc", "fedem", "fedavg", "fesem", "ifca", "cfl", "fedsoft"]
    names = {t.name for t in grid(table1, [0, 1, 2], [0.06, 0.1, 0.03, 0.01], True, set())}
    assert len(set(listed)) == len(listed) and set(listed) <= names
    first_plan = [m for n in read_state(results).done if (m := re.fullmatch(r"(\w+)-s(\d)", n))]
    assert first_plan  # the six seed-0 runs of the first plan
    assert not {f"{a}-lr0.1-s{s}" for a, s in (m.groups() for m in first_plan)} & set(listed)


def test_the_same_benchmark_is_its_clients_not_the_manifests_bytes(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A fresh machine's partition is the kept benchmark when its clients, concepts and seed
    are (shard hashes follow pyarrow's version, `config` gains fields); another benchmark is
    refused, and the kept manifest stays as the runs were trained on it."""
    from benchmarks.gpu_results import keep_manifest, same_benchmark

    kept = json.loads((tiny_data / "manifest.json").read_text())
    made = tmp_path / "made"
    made.mkdir()
    newer = {**kept, "content_hash": "0" * 64, "config": {**kept["config"], "new_key": None}}
    (made / "manifest.json").write_text(json.dumps(newer))
    assert same_benchmark(tiny_data / "manifest.json", made / "manifest.json")

    other = json.loads(json.dumps(kept))
    other["clients"][0]["label_histogram"][0] += 1
    (made / "manifest.json").write_text(json.dumps(other))
    assert not same_benchmark(tiny_data / "manifest.json", made / "manifest.json")
    (made / "manifest.json").write_text(json.dumps({**kept, "seed": kept["seed"] + 1}))
    assert not same_benchmark(tiny_data / "manifest.json", made / "manifest.json")

    results = tmp_path / "results"
    keep_manifest(tiny_data, results)
    first = (results / "data" / "federated" / "manifest.json").read_bytes()
    assert first == (tiny_data / "manifest.json").read_bytes()
    keep_manifest(made, results)  # a later partition leaves the kept one
    assert (results / "data" / "federated" / "manifest.json").read_bytes() == first
