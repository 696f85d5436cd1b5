"""The bytes a round's messages carry, counted in-process into metrics.jsonl, against the sizes
worked out by hand from the model and what each algorithm sends."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.run.traffic import Traffic, payload_bytes
from pipeline.stages import train_stage


def test_payload_bytes_by_hand() -> None:
    assert payload_bytes(torch.zeros(3, 5)) == 60  # float32
    assert payload_bytes(torch.zeros(4, dtype=torch.float64)) == 32
    assert payload_bytes({"a": torch.zeros(2, dtype=torch.int64), "b": [1, 2.5, True]}) == 33
    assert payload_bytes("ab€") == 5 and payload_bytes(None) == 0


def test_the_counts_sum_as_one_tensor() -> None:
    traffic = Traffic()
    traffic.down(torch.zeros(10))
    traffic.up({"omega": torch.zeros(2, dtype=torch.float64)})
    summed = traffic.tensor(torch.device("cpu")) * 2  # two places with the same counts
    assert Traffic.row(summed) == {"bytes_down": 80, "bytes_up": 32}


def _params(run: Path) -> int:
    return rf.load_state(run / rf.MODEL)["models"].shape[1]


def test_fedavg_sends_one_model_down_and_up_and_its_omega(tiny_runs: dict[str, Path]) -> None:
    """FedAvg: each sampled client receives the one model (P float32) and sends back its
    trained model and ω_i (one float64): P·4 down, P·4 + 8 up, per client."""
    run = tiny_runs["fedavg"]
    p = _params(run)
    for row in rf.read_metrics(run / rf.METRICS):
        assert row["bytes_down"] == row["clients"] * 4 * p
        assert row["bytes_up"] == row["clients"] * (4 * p + 8)


def test_ifca_receives_every_model_and_sends_back_one(tiny_data: Path, tmp_path: Path) -> None:
    """IFCA, K = 3: a client scores all three models (3·P·4 down) and trains its cluster's
    model alone (P·4 up) with its one-hot ω (3 float64)."""
    config = make_config(
        data=str(tiny_data), algorithm="ifca", out=str(tmp_path / "ifca"), rounds=2,
        local_epochs=1, batch_size=16, lr=0.05, clusters=3, participation=0.5, device="cpu",
    )  # fmt: skip
    run = train_stage(config)
    p = _params(run)
    rows = rf.read_metrics(run / rf.METRICS)
    assert all(r["clients"] == 6 for r in rows)  # half of the 12
    for row in rows:
        assert row["bytes_down"] == 6 * 3 * 4 * p
        assert row["bytes_up"] == 6 * (4 * p + 3 * 8)
