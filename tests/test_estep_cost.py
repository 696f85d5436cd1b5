"""A round computes only what its algorithm reads (issue 45): the K models' logits on a client's
samples only for the rows its E-step reads (`Algorithm.reads`, `ClientStep.reads`), evaluation
only for the predictors each client's ω weighs, and accuracies in one pass. The numbers stay
those of computing everything (the golden curves; here, `accuracies` against the per-client
rule it replaced, and `logits_where` against a full pass)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ALGORITHMS, load_script

from pipeline.algorithms.client import accuracies, mean_of_counts
from pipeline.data.shards import load_federated
from pipeline.engine.inference import known, logits_where
from pipeline.places.communicate import Communicator
from pipeline.run import training
from pipeline.run.resolve import make_config
from pipeline.run.setup import Run

CPU = torch.device("cpu")
BENCHMARK = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "method_floor.py")
EXTRA = {
    "fedprox": {"mu": 0.01},
    "fedsoft": {"mu": 0.01},
    "fesem-cam": {"mu": 0.01, "warmup_rounds": 1},
    "ifca-cam": {"warmup_rounds": 1},
    "flux": {"cluster_round": 2},
    "fedccfa": {"align_after": 1},
}


def tiny_run(data: Path, algorithm: str, **extra) -> Run:
    values = dict(rounds=5, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
    values.update({"participation": 1.0, **EXTRA.get(algorithm, {}), **extra})
    config = make_config(data=str(data), out="unused", algorithm=algorithm, **values)
    return training.build_run(config, load_federated(data), Communicator(CPU))


class Counted:
    """Counts what `run.executor.logits` computes (rows × samples) and each client step made."""

    def __init__(self, run: Run) -> None:
        self.inferred, self.steps = 0, {}
        logits, client_step = run.executor.logits, run.algorithm.client_step

        def counted_logits(models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
            self.inferred += models.shape[0] * images.shape[0]
            return logits(models, images)

        def recorded_step(client: int):
            self.steps[client] = step = client_step(client)
            return step

        run.executor.logits, run.algorithm.client_step = counted_logits, recorded_step


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_round_infers_only_what_the_e_step_reads(algorithm: str, tiny_data: Path) -> None:
    """Round 3 (every client seen before, warm-ups over): the models' inference is what the
    method's rule reads by its paper (`paper_rows`, beside the benchmark that uses it), e.g.
    none for FeSEM, CFL, PACFL, FLUX and FedAvg, K × samples for FedRC; local training is
    untouched (forward passes in training mode, counted apart)."""
    run = tiny_run(tiny_data, algorithm)
    for round_ in (1, 2):
        training.train_round(round_, run, None)
    clusters = getattr(run.algorithm, "cluster", torch.zeros(0)).clone()
    counted, trained = Counted(run), [0]
    run.executor.model.register_forward_pre_hook(
        lambda module, args: trained.__setitem__(0, trained[0] + module.training * len(args[0]))
    )
    training.train_round(3, run, None)
    rows = BENCHMARK.paper_rows(algorithm, run, counted.steps, clusters)
    sizes = {c: run.data.clients[c].train_size for c in run.data.participating}
    assert counted.inferred == sum(rows[c] * sizes[c] for c in sizes)
    assert trained[0] >= sum(sizes.values())  # every client trained at least one model


def test_fesem_s_first_round_scores_every_model_and_then_none(tiny_data: Path) -> None:
    """FeSEM's first assignment is the lowest loss (K models' inference); from then on the
    server's cluster: no inference."""
    run = tiny_run(tiny_data, "fesem")
    counted = Counted(run)
    samples = sum(run.data.clients[c].train_size for c in run.data.participating)
    training.train_round(1, run, None)
    assert counted.inferred == run.algorithm.num_models * samples
    training.train_round(2, run, None)
    assert counted.inferred == run.algorithm.num_models * samples


def test_a_cfl_client_that_missed_a_split_scores_the_two_halves(tiny_data: Path) -> None:
    """CFL: only a member not sampled when its cluster split reads losses, those of the two
    halves."""
    run = tiny_run(tiny_data, "cfl", participation=0.5, cfl_eps1=10.0, cfl_eps2=0.01)
    for round_ in (1, 2, 3):
        counted = Counted(run)
        training.train_round(round_, run, None)
        pending = {c: s.halves.numel() for c, s in counted.steps.items()}
        sizes = {c: run.data.clients[c].train_size for c in pending}
        assert counted.inferred == sum(pending[c] * sizes[c] for c in pending)
    assert run.algorithm.clusters > 1


def test_an_evaluation_infers_the_predictors_each_client_weighs(tiny_data: Path) -> None:
    """FeSEM's evaluation: every model on the held-out clients (they fit their ω), the one
    model of its cluster on a participating client; FedRC's: every model everywhere. The
    logits it keeps are exact where computed and serve the next E-step."""
    for algorithm in ("fesem", "fedrc"):
        run = tiny_run(tiny_data, algorithm)
        training.train_round(1, run, None)
        counted, data = Counted(run), run.data
        _, logits = training.evaluation_checked(run, 1, data)
        pairs = set()
        for client in range(len(data.clients)):
            rows = range(data.train_slices[client].start, data.test_slices[client].stop)
            images = set(data.inverse[list(rows)].tolist())
            held = client in data.held_out or algorithm == "fedrc"
            models = range(run.algorithm.num_rows) if held else [int(run.algorithm.cluster[client])]
            pairs |= {(m, i) for m in models for i in images}
        assert counted.inferred == len(pairs)
        full = run.executor.logits(run.models, data.images)
        computed = known(logits)
        assert torch.equal(logits[computed], full[computed])
        if algorithm == "fedrc":
            assert bool(computed.all())
        before = counted.inferred
        training.train_round(2, run, logits)  # FedRC's E-step takes them all from the cache
        assert counted.inferred == before


def reference(logits, labels, spans, weights) -> torch.Tensor:
    """The per-span rule `accuracies` replaced: one prediction and one read per number."""
    out = torch.zeros((2, len(spans)), dtype=torch.float64)
    for s, (start, stop) in enumerate(spans):
        part, omega = logits[:, start:stop], weights[s]
        hard = part[int(torch.argmax(omega))].argmax(-1)
        soft = (omega.to(part).view(-1, 1, 1) * torch.softmax(part, dim=-1)).sum(0).argmax(-1)
        for row, pred in enumerate((soft, hard)):
            out[row, s] = float((pred == labels[start:stop]).float().mean())
    return out


def test_accuracies_in_one_pass_equal_the_per_client_rule() -> None:
    """Soft and hard, with zero weights, ties between classes and between weights, spans of
    every size including empty ones: the same numbers to the bit; a model whose weight is 0
    may be NaN (never computed)."""
    generator = torch.Generator().manual_seed(0)
    k, classes = 3, 10
    stops = torch.randint(0, 40, (30,), generator=generator).cumsum(0)
    spans = list(zip([0, *stops[:-1].tolist()], stops.tolist()))
    n = int(stops[-1])
    logits = torch.randn(k, n, classes, generator=generator).round(decimals=1)  # ties
    labels = torch.randint(0, classes, (n,), generator=generator)
    weights = torch.rand(len(spans), k, generator=generator, dtype=torch.float64)
    weights[::3, 1] = 0.0
    weights[1::4] = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    weights[2::5] = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    expected = reference(logits, labels, spans, weights)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(accuracies(logits, labels, spans, weights), expected, **exact)
    unread = logits.clone()
    for s, (start, stop) in enumerate(spans):
        unread[weights[s] == 0, start:stop] = float("nan")
    torch.testing.assert_close(accuracies(unread, labels, spans, weights), expected, **exact)


def test_counts_become_torch_s_means() -> None:
    for size in range(1, 300):
        for count in (0, 1, size // 3, size - 1, size):
            right = torch.zeros(size)
            right[:count] = 1.0
            got = mean_of_counts(torch.tensor([float(count)]), torch.tensor([float(size)]), CPU)
            assert float(got) == float(right.mean())


def test_logits_where_computes_the_pairs_asked_once(tiny_data: Path) -> None:
    """The pairs asked for equal a full pass bit for bit, the others are NaN, and pairs a cache
    holds are not computed again."""
    run = tiny_run(tiny_data, "fedrc", clusters=3)
    counted, images = Counted(run), run.data.images[:100]
    full = run.executor.logits(run.models, images)
    need = torch.zeros(3, 100, dtype=torch.bool)
    need[0, :30], need[:, 50:60], need[2, 90:] = True, True, True
    first = logits_where(run.executor, run.models, images, need, 10)
    assert torch.equal(known(first), need)
    assert torch.equal(first[need], full[need])
    counted.inferred = 0
    more = need.clone()
    more[1, :] = True
    second = logits_where(run.executor, run.models, images, more, 10, first.clone())
    assert counted.inferred == int((more & ~need).sum())
    assert torch.equal(second[more], full[more])
