"""Where a paper-scale round's time goes: `torch.profiler` over a few rounds of a real run, as a
short text summary (the GPU check keeps it as `profile.md`), so that the work on speed between
GPU sessions follows measurements.

The run is the one the GPU check trains (`experiments/fmnist/params.yaml`, FedRC by default, on
the partitioned benchmark given as `--data`), played round by round with the round loop's own
`play_round`, evaluation included. The summary gives, per round: the wall time unprofiled and
profiled; the time the GPU was busy and the idle gaps between its work; the kernels launched,
the largest by time and how many were tiny; the copies between host and device and the host
waits on the device; the host time of each phase (E-step, local training, aggregation,
evaluation) with the GPU's busy share inside it; the top host operators; the peak memory; a
cProfile of one round's Python; and a few settings that need no code change (cuDNN's autotuner,
TF32 matrix products), each timed over the same rounds.

    PYTHONPATH=. python3 benchmarks/gpu_profile.py --data DIR --device cuda
    PYTHONPATH=. python3 benchmarks/gpu_profile.py --data DIR --device cpu --rounds 1  # CI
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import itertools

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from pipeline.config import read_params
from pipeline.places.communicate import Communicator
from pipeline.run import training
from pipeline.run.resolve import train_config
from pipeline.run.setup import Progress, Run, build_run, load_data

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "experiments" / "fmnist" / "params.yaml"
PHASES = {  # pipeline.run.training's functions that make up a round, and what they do
    "client_parts": "the clients' parts: E-step and local training (FedRC, FedEM, …)",
    "estep_inputs": "E-step losses, for algorithms without a client part",
    "train_and_fold": "local training and folding, for algorithms without a client part",
    "evaluation_checked": "evaluation (every round under the paper's protocol)",
}
INNER = {  # methods of the run's parts, inside the phases above
    ("executor", "logits"): "inference of model rows on many images (E-step, evaluation)",
    ("executor", "_train_chunk"): "local SGD of a chunk of tasks (batched executor)",
    ("executor", "train"): "local SGD of one task (sequential executor)",
    ("algorithm", "e_step"): "one client's E-step from its losses",
    ("algorithm", "fold"): "one local result added to the sums",
    ("algorithm", "aggregate"): "the server's aggregation (a phase of its own)",
    ("momentum", "attach"): "a task's momentum buffer handed over (a view)",
    ("momentum", "keep"): "a task's trained momentum buffer kept for its chunk's write",
    ("momentum", "flush"): "a chunk's momentum buffers written at once",
}
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPIES = ("cudaMemcpyAsync", "cudaMemcpy")
SIZE_BINS_US = (5.0, 20.0, 100.0, 1000.0)  # kernel durations, for "how many were tiny"


class Round:
    """A run, built as `fedrc train` builds it, played one round after another."""

    def __init__(self, run: Run) -> None:
        self.run, self.progress, self.number = run, Progress(), 0

    def play(self, count: int) -> float:
        """`count` rounds; their wall seconds, the device synchronised at both ends."""
        sync(self.run.comm.device)
        tic = time.perf_counter()
        for _ in range(count):
            self.number += 1
            training.play_round(self.number, self.run, self.run.data, self.progress)
        sync(self.run.comm.device)
        return time.perf_counter() - tic


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args: argparse.Namespace, out: Path) -> Round:
    options = {
        "algorithm": args.algorithm,
        "data": args.data,
        "device": args.device,
        "out": str(out),
    }
    config = train_config(read_params(Path(args.params)), options, args.set)
    comm = Communicator(training.resolve_device(config.device))
    data = load_data(config, comm)
    config = config.over_steps(data.time_steps)
    return Round(build_run(config, data, comm, out))


def labelled(label: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def labelled_phases(run: Run) -> Iterator[None]:
    """Each phase of the round, and each method of `INNER`, inside a `record_function` range
    named after it (`phase::NAME`, `inner::PART.METHOD`)."""
    originals = {name: getattr(training, name) for name in PHASES}
    parts = [(getattr(run, part), method) for part, method in INNER]
    parts = [(obj, method) for obj, method in parts if hasattr(obj, method)]
    try:
        for name, fn in originals.items():
            setattr(training, name, labelled(f"phase::{name}", fn))
        for obj, method in parts:
            part = next(p for p, m in INNER if getattr(run, p) is obj and m == method)
            level = "phase" if method == "aggregate" else "inner"
            setattr(obj, method, labelled(f"{level}::{part}.{method}", getattr(obj, method)))
        yield
    finally:
        for name, fn in originals.items():
            setattr(training, name, fn)
        for obj, method in parts:
            vars(obj).pop(method, None)  # the class's method again


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, merged intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def overlap(busy: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in busy)


def gaps(busy: list[tuple[float, float]]) -> list[float]:
    return [b[0] - a[1] for a, b in itertools.pairwise(busy)]


def table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def short(name: str, width: int = 90) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[: width - 1] + "…"


def device_work(events: list) -> list:
    """The kernels, copies and fills on the device; without the device-side copies of this
    script's own `record_function` ranges, which span the work they label."""
    return [
        e for e in events
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("phase::", "inner::"))
    ]  # fmt: skip


def device_summary(events: list, wall_us: float, rounds: int, top: int) -> list[str]:
    """The GPU side: busy time, gaps, kernels by time and by size, copies."""
    on_gpu = device_work(events)
    if not on_gpu:
        return ["No device activity was recorded (a CPU run): the host tables below are all."]
    kernels = [e for e in on_gpu if not e.name.startswith(("Memcpy", "Memset"))]
    busy = union([(e.time_range.start, e.time_range.end) for e in on_gpu])
    busy_us = sum(e - s for s, e in busy)
    idle = gaps(busy)
    out = [
        f"GPU busy {busy_us / 1e3 / rounds:.1f} ms a round of {wall_us / 1e3 / rounds:.1f} ms "
        f"wall ({100 * busy_us / wall_us:.1f} %); {len(kernels) / rounds:.0f} kernels a round, "
        f"mean {sum(k.time_range.elapsed_us() for k in kernels) / max(len(kernels), 1):.1f} us.",
        f"Idle gaps between device work: {len(idle) / rounds:.0f} a round; over 100 us: "
        f"{sum(g > 100 for g in idle) / rounds:.0f} a round, "
        f"{sum(g for g in idle if g > 100) / 1e3 / rounds:.1f} ms; the longest "
        f"{max(idle, default=0) / 1e3:.1f} ms.",
        "",
        "Kernels by duration (per round):",
        "",
    ]
    edges = (0.0, *SIZE_BINS_US, float("inf"))
    rows = []
    for low, high in itertools.pairwise(edges):
        inside = [
            k.time_range.elapsed_us() for k in kernels if low <= k.time_range.elapsed_us() < high
        ]
        label = f"{low:g}–{high:g} us" if high != float("inf") else f"≥ {low:g} us"
        rows.append([label, f"{len(inside) / rounds:.0f}", f"{sum(inside) / 1e3 / rounds:.2f}"])
    out += [table(["duration", "kernels", "ms"], rows), "", f"Top {top} kernels by time:", ""]
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in on_gpu:
        by_name[k.name].append(k.time_range.elapsed_us())
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    out.append(table(
        ["kernel or copy", "calls / round", "ms / round", "mean us", "% of busy"],
        [[short(n), f"{len(d) / rounds:.1f}", f"{sum(d) / 1e3 / rounds:.2f}",
          f"{sum(d) / len(d):.1f}", f"{100 * sum(d) / busy_us:.1f}"] for n, d in ranked],
    ))  # fmt: skip
    copies = [e for e in on_gpu if e.name.startswith(("Memcpy", "Memset"))]
    kinds: dict[str, list[float]] = defaultdict(list)
    for c in copies:
        kinds[c.name.split(" (")[0]].append(c.time_range.elapsed_us())
    out += ["", "Copies and fills on the device (per round):", ""]
    rows = [[k, f"{len(d) / rounds:.1f}", f"{sum(d) / 1e3 / rounds:.2f}"] for k, d in kinds.items()]
    out.append(table(["kind", "count", "ms"], sorted(rows) or [["none", "0", "0"]]))
    return out


def host_summary(events: list, rounds: int, top: int) -> list[str]:
    """The host side: launches, waits, the phases with the GPU's share, top operators."""
    on_host = [e for e in events if e.device_type == DeviceType.CPU]
    on_gpu = device_work(events)
    busy = union([(e.time_range.start, e.time_range.end) for e in on_gpu])
    count = defaultdict(int)
    spent = defaultdict(float)
    for e in on_host:
        if e.name in LAUNCHES + WAITS + COPIES:
            count[e.name] += 1
            spent[e.name] += e.time_range.elapsed_us()
    runtime = [
        [name, f"{count[name] / rounds:.1f}", f"{spent[name] / 1e3 / rounds:.2f}"]
        for name in LAUNCHES + WAITS + COPIES
        if count[name]
    ]
    out = [
        "CUDA runtime calls on the host (per round; a copy to the host waits for the device):",
        "",
    ]
    out.append(table(["call", "count", "ms"], runtime or [["none (a CPU run)", "0", "0"]]))
    out += [
        "",
        "Phases of the round (host wall time inside each, and the GPU busy then); the "
        "parts below the line run inside the phases above it:",
        "",
    ]
    out.append(table(["phase", "what", "calls / round", "ms / round", "GPU busy"],
                     phase_rows(on_host, busy, rounds, bool(on_gpu))))  # fmt: skip
    ops = defaultdict(lambda: [0, 0.0])
    for e in on_host:
        if e.name.startswith(("phase::", "inner::")):
            continue
        ops[e.name][0] += 1
        ops[e.name][1] += e.self_cpu_time_total
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
    out += ["", f"Top {top} host operators by self time (per round):", ""]
    out.append(table(
        ["operator", "calls / round", "self ms / round"],
        [[short(n), f"{c / rounds:.1f}", f"{us / 1e3 / rounds:.2f}"] for n, (c, us) in ranked],
    ))  # fmt: skip
    return out


def phase_rows(on_host: list, busy: list, rounds: int, gpu: bool) -> list[list[str]]:
    what = {f"phase::{k}": v for k, v in PHASES.items()}
    what |= {
        f"{'phase' if m == 'aggregate' else 'inner'}::{p}.{m}": v for (p, m), v in INNER.items()
    }
    seen = defaultdict(lambda: [0, 0.0, 0.0])
    for e in on_host:
        if e.name in what:
            seen[e.name][0] += 1
            seen[e.name][1] += e.time_range.elapsed_us()
            seen[e.name][2] += overlap(busy, e.time_range.start, e.time_range.end)
    rows = []
    for level in ("phase::", "inner::"):
        ranked = sorted(
            (kv for kv in seen.items() if kv[0].startswith(level)), key=lambda kv: -kv[1][1]
        )
        if level == "inner::" and ranked:
            rows.append(["—", "—", "—", "—", "—"])
        rows += [
            [name.removeprefix(level), what[name], f"{n / rounds:.1f}", f"{us / 1e3 / rounds:.1f}",
             f"{100 * on / us:.0f} %" if us and gpu else "–"]
            for name, (n, us, on) in ranked
        ]  # fmt: skip
    return rows


def python_summary(game: Round, top: int) -> list[str]:
    """cProfile of one round: fedrc's own functions by cumulative time."""
    profiler = cProfile.Profile()
    profiler.enable()
    game.play(1)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
    stats.print_stats(r"pipeline/", top)
    lines = text.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    body = [line.replace(str(ROOT) + "/", "") for line in lines[start:] if line.strip()]
    return ["cProfile of one round, fedrc's functions by cumulative time:", "", "```", *body, "```"]


@contextmanager
def setting(name: str) -> Iterator[None]:
    """A setting that changes no code, switched on for the rounds inside."""
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)  # fmt: skip
    try:
        if name == "cudnn.benchmark":
            torch.backends.cudnn.benchmark = True
        elif name == "tf32 matmul":
            torch.backends.cuda.matmul.allow_tf32 = True
        elif name == "no tf32 (strict fp32)":
            torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = saved  # fmt: skip


VARIANTS = ("as is", "cudnn.benchmark", "tf32 matmul", "no tf32 (strict fp32)")


def variants_summary(game: Round, rounds: int, repeats: int = 2) -> list[str]:
    """Seconds a round under each setting, the settings taken in turn `repeats` times (each
    turn after one round to warm its kernels), so that a drift of the run's speed over its
    rounds (its clusters change) falls on every setting alike."""
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name in VARIANTS:
            with setting(name):
                game.play(1)
                times[name].append(game.play(rounds) / rounds)
    rows = [[name, f"{min(t):.3f}", f"{max(t):.3f}"] for name, t in times.items()]
    return [
        f"Settings that need no code change, s / round ({repeats} turns of {rounds} rounds):",
        "",
        table(["setting", "fastest turn", "slowest turn"], rows),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the partitioned benchmark (fedrc partition)")
    parser.add_argument("--params", default=str(PARAMS))
    parser.add_argument("--algorithm", default="fedrc")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, as fedrc train")
    parser.add_argument("--warmup", type=int, default=2, help="rounds before any measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds timed, profiled, per setting")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--trace", help="also write the profiler's Chrome trace to this file")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*Profiler clears events")  # one cycle only
    with tempfile.TemporaryDirectory() as out:
        print("\n".join(report(args, Path(out))))
    return 0


def report(args: argparse.Namespace, out: Path) -> list[str]:
    """Build the run in `out`, play its rounds, and summarise them (the module's docstring)."""
    device = torch.device(args.device)
    tic = time.perf_counter()
    game = build(args, out)
    built = time.perf_counter() - tic
    game.play(args.warmup)
    plain = game.play(args.rounds)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.reset_peak_memory_stats(device)
    with labelled_phases(game.run), profile(activities=activities) as prof:
        profiled = game.play(args.rounds)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    events = list(prof.events())
    run = game.run
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [
        f"# Profile of {run.config.algorithm} at the GPU check's scale on {name}",
        "",
        f"torch {torch.__version__}; {len(run.data.participating)} participating clients, "
        f"K = {run.algorithm.num_models}, model {run.config.model}, batch "
        f"{run.config.batch_size}, executor {type(run.executor).__name__}, precision "
        f"{run.config.precision}; built in {built:.1f} s; {args.warmup} warm-up round(s).",
        "",
        f"Wall time a round: {plain / args.rounds:.3f} s unprofiled, "
        f"{profiled / args.rounds:.3f} s under the profiler ({args.rounds} rounds each).",
        "",
        *device_summary(events, profiled * 1e6, args.rounds, args.top),
        "",
        *host_summary(events, args.rounds, args.top),
        "",
    ]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        reserved = torch.cuda.memory_reserved(device) / 2**30
        lines += [f"GPU memory: peak allocated {peak:.2f} GiB, reserved {reserved:.2f} GiB.", ""]
    lines += python_summary(game, args.top)
    if device.type == "cuda":
        lines += ["", *variants_summary(game, args.rounds)]
    return lines


if __name__ == "__main__":
    sys.exit(main())
