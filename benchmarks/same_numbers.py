"""Whether two checkouts train the same numbers: every built-in algorithm on the tiny synthetic
benchmark, in a few settings, each run's model.pt and metrics.jsonl (without `seconds`) hashed,
here and in `--before DIR` (a worktree of another commit), each checkout in its own process.

A change meant to save work and no number (issue 45: a round computes only what its algorithm
reads) must print `same` on every line: the golden curves only hold to 1e-3.

    git worktree add --detach /tmp/before COMMIT
    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/same_numbers.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {  # name → train options
    "half, evaluated every round": dict(participation=0.5, eval_every=1),
    "half, evaluated every other round": dict(participation=0.5, eval_every=2),
    "all, evaluated every round": dict(participation=1.0, eval_every=1),
    "half, persistent momentum 0.9": dict(
        participation=0.5, eval_every=1, momentum=0.9, persistent_momentum=True
    ),
}
EXTRA = {  # the golden curves' settings (tests/test_golden.py): every method's rule at work
    "fedprox": {"mu": 0.01},
    "fedsoft": {"mu": 0.01},
    "fesem-cam": {"mu": 0.01, "warmup_rounds": 1},
    "ifca-cam": {"warmup_rounds": 1},
    "cfl": {"cfl_eps1": 10.0, "cfl_eps2": 0.01},
    "fedrc": {"estep": "adam", "prune_threshold": 0.05},
    "flux": {"cluster_round": 2},
    "fedccfa": {"align_after": 1},
}


def digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()[:16]


def runs(folder: Path) -> dict[str, str]:
    """Every (setting, algorithm)'s hashes, trained by the checkout this process imports."""
    import torch

    from pipeline.algorithms import BUILT_IN
    from pipeline.common.errors import FedrcError
    from pipeline.config import PartitionConfig
    from pipeline.run.resolve import make_config
    from pipeline.stages import partition_stage, train_stage

    torch.set_num_threads(1)
    data = folder / "data"
    tiny = dict(dataset="synthetic", clients=12, samples_per_client=60, holdout_samples=200)
    partition_stage(PartitionConfig(**tiny, out=str(data)))
    found = {}
    for name, options in SETTINGS.items():
        for algorithm in BUILT_IN:
            config = make_config(
                data=str(data), algorithm=algorithm, out=str(folder / f"{name}-{algorithm}"),
                rounds=4, local_epochs=2, batch_size=16, lr=0.05, clusters=2, device="cpu",
                **options, **EXTRA.get(algorithm, {}),
            )  # fmt: skip
            try:
                run = train_stage(config)
            except FedrcError as e:  # a refused setting (FedCCFA with persistent momentum)
                found[f"{name} | {algorithm}"] = f"refused: {str(e)[:40]}"
                continue
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row in rows:
                row.pop("seconds", None)
            model = digest((run / "model.pt").read_bytes())
            found[f"{name} | {algorithm}"] = f"{model} {digest(json.dumps(rows).encode())}"
    return found


def in_checkout(root: Path, out: Path) -> dict[str, str]:
    """`runs` in a child process importing the checkout at `root`."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, __file__, "--child", str(out)]
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return json.loads((out / "hashes.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=False, help="the other checkout's root")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # this process trains with whatever checkout PYTHONPATH names
        out = Path(args.child)
        (out / "hashes.json").write_text(json.dumps(runs(out)))
        return
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        ours = in_checkout(here, Path(tmp))
        theirs = {}
        if args.before:
            (Path(tmp) / "before").mkdir()
            theirs = in_checkout(Path(args.before), Path(tmp) / "before")
    print("| setting | algorithm | model.pt, metrics | before |")
    print("|---|---|---|---|")
    for key, value in ours.items():
        verdict = "–" if not theirs else "same" if theirs.get(key) == value else "DIFFERENT"
        print(f"| {key} | {value} | {verdict} |")
    if theirs:
        same = sum(theirs.get(k) == v for k, v in ours.items())
        print(f"\n{same} of {len(ours)} runs the same as before")


if __name__ == "__main__":
    main()
