"""fedrc's Flower apps, named in the app's pyproject.toml (`fedrc flower app` writes it):

    serverapp = "pipeline.flower.apps:server_app"
    clientapp = "pipeline.flower.apps:client_app"

The ServerApp reads the run config (`fedrc-train`: the resolved `train:` section as JSON, and
the deployment keys of `appconfig.Deployment`); a ClientApp reads its node config:
`fedrc-data` (the benchmark folder on that machine), `fedrc-clients` (the client ids whose
shards it holds: "3", "0,4,7" or "all"; default all) and `fedrc-device` (auto, cpu, cuda).
"""

from __future__ import annotations

import logging

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from pipeline.common.errors import FedrcError
from pipeline.flower import node, wire
from pipeline.flower.appconfig import run_settings, train_config_from_json
from pipeline.flower.server import serve

log = logging.getLogger("fedrc.flower")
server_app = ServerApp()
client_app = ClientApp()


class RunFailed(Exception):
    """A fedrc error in the ServerApp. Flower catches an Exception (not SystemExit), marks the
    run failed with its text (`flwr ls`) and sends the last log lines to `flwr run --stream`."""


def log_to_stderr() -> None:
    """fedrc's lines in the ServerApp's log; other libraries (httpx: a line per request to
    the SuperLink) keep their own levels."""
    fedrc_log = logging.getLogger("fedrc")
    if not fedrc_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        fedrc_log.addHandler(handler)
        fedrc_log.setLevel(logging.INFO)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    log_to_stderr()
    try:
        config = train_config_from_json(str(context.run_config["fedrc-train"]))
        deployment, resume, overwrite = run_settings(context.run_config)
        out = serve(grid, config, deployment, resume, overwrite)
    except FedrcError as e:
        log.error("fedrc: error: %s", e)
        raise RunFailed(f"fedrc: error: {e}") from None
    log.info("fedrc: run written to %s", out)


def _answer(message: Message, context: Context, work) -> Message:
    """Run `work(node_data, executor, algorithm, content, state)` for this node (`state`: the
    node's Flower state for the run); a fedrc error travels back as one line."""
    settings = context.node_config
    try:
        folder = str(settings["fedrc-data"])
    except KeyError:
        return Message(
            wire.failure("node config has no fedrc-data (the benchmark folder)"), reply_to=message
        )
    clients = str(settings.get("fedrc-clients", "all"))
    try:
        data = node.node_data(folder, clients)
        device = str(settings.get("fedrc-device", "auto"))
        config = str(context.run_config["fedrc-train"])
        algorithm = node.node_algorithm(config, folder, clients, device)
        if work is None:
            return Message(data.hello(not algorithm.client_part), reply_to=message)
        executor = node.node_executor(config, folder, clients, device)
        reply = work(data, executor, algorithm, message.content, context.state)
        return Message(reply, reply_to=message)
    except FedrcError as e:
        return Message(wire.failure(str(e)), reply_to=message)


@client_app.query("hello")
def hello(message: Message, context: Context) -> Message:
    return _answer(message, context, None)


@client_app.query("logits")
def logits(message: Message, context: Context) -> Message:
    return _answer(message, context, lambda d, e, a, content, s: node.answer_logits(d, e, content))


@client_app.train("fedrc")
def train(message: Message, context: Context) -> Message:
    return _answer(message, context, lambda d, e, a, content, s: node.answer_train(d, e, content))


@client_app.train("steps")
def steps(message: Message, context: Context) -> Message:
    return _answer(message, context, node.answer_steps)


@client_app.evaluate("scores")
def scores(message: Message, context: Context) -> Message:
    return _answer(
        message, context, lambda d, e, a, content, s: node.answer_scores(d, e, a, content)
    )
