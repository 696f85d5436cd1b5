"""A Flower deployment on this machine, for tests, benchmarks and a first try (docs/flower.md,
"From Python, for a first try"): one SuperLink and N SuperNodes as separate processes on
127.0.0.1 (insecure mode, free ports), runs started with `flwr run`, every process stopped at
the end (`with LocalDeployment(folder, node_configs):`).
A subclass changes how the processes and the CLI authenticate by overriding the `*_security`
methods (tests/flower/secure.py: TLS and node authentication).

Flower's executables are found next to this Python (the virtual environment's bin folder),
which must also be on PATH: the SuperLink and SuperNodes start `flwr-serverapp` and
`flwr-clientapp` by name."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlowerRun(NamedTuple):
    output: str  # what `flwr run --stream` printed
    status: str  # finished:completed, finished:failed, …
    details: str  # why it failed ("ServerApp failed with exception: fedrc: error: …")


class LocalDeployment:
    def __init__(self, root: Path, node_configs: list[dict[str, str]]) -> None:
        """`root`: a folder for the processes' logs and homes; one SuperNode per node config."""
        self.root = root
        self.node_configs = node_configs
        self.port = free_port()
        self.processes: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }

    def start(self, timeout: float = 60) -> LocalDeployment:
        """Start the SuperLink and the SuperNodes; on any failure, stop what was started."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> LocalDeployment:
        self.root.mkdir(parents=True, exist_ok=True)
        self.spawn(
            "superlink",
            [
                *(str(BIN / "flower-superlink"), *self.superlink_security()),
                *("--host", "127.0.0.1", "--port", str(self.port)),
                "--disable-runtime-dependency-installation",
            ],  # state in memory: SQLite (--database) locks up under large messages
        )
        self.wait_healthy(timeout)
        (self.root / "cli").mkdir(exist_ok=True)
        (self.root / "cli" / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{self.port}"\n{self.cli_security()}\n'
        )
        for i, config in enumerate(self.node_configs):
            self.nodes.append(self.start_node(i, config))
        self.wait_nodes(len(self.node_configs), timeout)
        return self

    def superlink_security(self) -> list[str]:
        return ["--insecure"]

    def node_security(self, i: int) -> list[str]:
        """The i-th SuperNode's security flags."""
        return ["--insecure"]

    def cli_security(self) -> str:
        """The `flwr` CLI's security lines in its federation's table."""
        return "insecure = true"

    def start_node(self, i: int, config: dict[str, str]) -> subprocess.Popen:
        values = " ".join(f'{key}="{value}"' for key, value in config.items())
        return self.spawn(
            f"supernode{i}",
            [
                *(str(BIN / "flower-supernode"), *self.node_security(i)),
                *("--superlink", f"127.0.0.1:{self.port}", "--host", "127.0.0.1"),
                *("--port", str(free_port()), "--node-config", values),
            ],
        )

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        home = self.root / f"{name}-home"
        home.mkdir(exist_ok=True)
        with (self.root / f"{name}.log").open("w") as log:  # the process keeps its own copy
            process = subprocess.Popen(
                command,
                env={**self.env, "FLWR_HOME": str(home)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with its children
            )
        self.processes.append(process)
        return process

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(f"SuperLink did not listen on {self.port}: {self.logs()}")

    def flwr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "FLWR_HOME": str(self.root / "cli")}
        return subprocess.run(
            [str(BIN / "flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    def online(self) -> int:
        """How many SuperNodes the SuperLink lists as online."""
        done = self.flwr("supernode", "list", "local", "--format", "json", timeout=60)
        try:
            nodes = json.loads(done.stdout).get("nodes", [])
        except json.JSONDecodeError:
            return 0
        return sum(1 for node in nodes if node.get("status") == "online")

    def wait_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        online = 0
        while time.monotonic() < deadline:
            online = self.online()
            if online >= count:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{online} of {count} SuperNodes online: {self.logs()}")

    def runs(self) -> dict[str, dict]:
        """`flwr ls`: every run by id, with its `status` (`finished:completed` when it
        succeeded) and `status-details`."""
        done = self.flwr("ls", "local", "--format", "json", timeout=60)
        return {run["run-id"]: run for run in json.loads(done.stdout)["runs"]}

    def run(self, app: Path, config: str = "", timeout: float = 600) -> FlowerRun:
        """`flwr run APP local --stream`: waits for the run to end. `flwr run` exits 0 even
        when the ServerApp fails, so the run's status is read from `flwr ls`."""
        before = set(self.runs())
        args = ["run", str(app), "local", "--stream"]
        if config:
            args += ["--run-config", config]
        done = self.flwr(*args, timeout=timeout)
        new = [run for key, run in self.runs().items() if key not in before]
        if len(new) != 1:
            raise RuntimeError(f"flwr run started {len(new)} runs: {done.stdout[-2000:]}")
        return FlowerRun(done.stdout + done.stderr, new[0]["status"], new[0]["status-details"])

    def kill_node(self, i: int) -> None:
        os.killpg(self.nodes[i].pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log"))
        )

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
