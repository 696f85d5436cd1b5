"""The start across machines (docs/flower.md), on 127.0.0.1: a SuperLink with TLS and node
authentication, SuperNodes with the CA's certificate and registered keys. FedRC ends with
`fedrc train`'s models and metrics over it, and a SuperNode whose key was never registered
is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flower_runs import assert_same_run, flower_config, node_configs, reference, write_app
from secure import SecureDeployment

NODES = 3


@pytest.fixture(scope="module")
def secure(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("secure")
    configs = node_configs(tiny_data, nodes=NODES)
    with SecureDeployment(root, configs, unregistered={NODES}) as running:
        yield running


def test_tls_and_node_auth_deployment_equals_fedrc_train(
    secure: SecureDeployment, tiny_data: Path, tmp_path: Path
) -> None:
    expected = reference(flower_config(tiny_data, "fedrc", tmp_path / "single", rounds=2))
    out = tmp_path / "flower"
    write_app(tmp_path / "app", tiny_data, out, "fedrc", "--rounds=2", "--wait=60")
    done = secure.run(tmp_path / "app", timeout=300)
    assert done.status == "finished:completed", done.output[-3000:] + secure.logs()
    assert_same_run(expected, out)


def test_unregistered_supernode_is_refused(secure: SecureDeployment, tiny_data: Path) -> None:
    node = secure.start_node(NODES, node_configs(tiny_data, nodes=NODES)[0])
    deadline = time.monotonic() + 60
    while node.poll() is None:
        assert time.monotonic() < deadline, secure.logs()
        time.sleep(0.2)
    assert node.returncode != 0
    assert "Failed to activate SuperNode" in (secure.root / f"supernode{NODES}.log").read_text()
    refusal = "No SuperNode found with the given public key"
    assert refusal in (secure.root / "superlink.log").read_text()
    assert secure.online() == NODES  # the registered ones, and only they
