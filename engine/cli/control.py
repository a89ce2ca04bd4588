"""`sapo pause | resume | finish | status`: drive a running engine over its local control API.

What an OS scheduler, a cron job or an electricity-price script calls. The engine is found the way
the app finds it (control.json and control.token in the data dir); with none running, each command
says so in one line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.control.client import ControlClient, ControlError
from engine.control.launcher import find_engine
from engine.control.protocol import status_to_wire
from engine.control.status import NodeStatus
from engine.control.token import ControlInfo, TokenError, read_token
from engine.errors import SapoError
from engine.events import ACTIVE_STATES
from engine.paths import default_data_dir

EXIT_NO_ENGINE = 1
RESUME_SETTLE_S = 3.0  # how long `resume` waits to say whether a rule still holds the node
FINISH_TIMEOUT_S = 3600.0  # a real model's round takes minutes; a cap so a script never hangs forever
STATUS_JSON_KEYS = ("state", "paused_by", "detail", "round", "policy_version", "peers", "model", "model_name",
                    "device", "backend", "peer_name", "data_dir")


class NoEngine(SapoError):
    """No engine serves this data dir, or it cannot be reached."""


def register(sub: Any) -> None:
    specs = (("pause", "pause training after the round in flight (the engine stays up; `sapo resume` goes on)"),
             ("resume", ("resume training: lifts a pause by hand and a snooze (the schedule, battery and "
                         "temperature rules still apply); an engine that is not training joins")),
             ("finish", ("let the round in flight finish, then stop training (checkpointed; the engine stays up "
                         "and `sapo resume` trains again)")),
             ("status", "the engine's state, why it is paused, its round"))
    for name, text in specs:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--data-dir", type=Path, default=None, help="the engine's data dir (default: the user's)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        if name == "finish":
            p.add_argument("--timeout", type=float, default=FINISH_TIMEOUT_S, metavar="SECONDS",
                           help=f"give up waiting for the round after this long (default {FINISH_TIMEOUT_S:g})")
        p.set_defaults(func=run, control_command=name)


def run(args: argparse.Namespace) -> int:
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    try:
        info = _engine(data_dir)
        return asyncio.run(_command(args, info, read_token(data_dir)))
    except (NoEngine, TokenError, ControlError) as exc:
        print(f"sapo {args.control_command}: {exc}", file=sys.stderr)
        return EXIT_NO_ENGINE


def _engine(data_dir: Path) -> ControlInfo:
    info = find_engine(data_dir)
    if info is None:
        raise NoEngine(f"no engine is running for {data_dir} (start one with `sapo run --control` or `sapo gui`)")
    return info


async def _command(args: argparse.Namespace, info: ControlInfo, token: str) -> int:
    name = args.control_command
    timeout = max(1.0, float(getattr(args, "timeout", 30.0))) if name == "finish" else 30.0
    async with ControlClient(info.url, token, timeout_s=timeout) as client:
        if name == "status":
            status = await client.status()
            print(json.dumps(status_object(status, info)) if args.json else status_text(status))
            return 0
        if name == "finish":
            print("finishing the round in flight ...", file=sys.stderr, flush=True)
            await client.call("finish")
            status = await client.status()
            print(f"finished after round {status.round}: training stopped, the engine stays up "
                  "(`sapo resume` trains again)")
            return 0
        if name == "pause":
            await client.call("pause", {"after_round": True})
            status = await client.status()
            print("pausing: the round in flight finishes first" if status.state == "pausing"
                  else status_text(status))
            return 0
        await client.call("resume")
        print(status_text(await _settled(client)))
        return 0


async def _settled(client: ControlClient) -> NodeStatus:
    """The status once the node has re-read its rules after a resume (a paused node wakes between
    checks), or after RESUME_SETTLE_S."""
    deadline = time.monotonic() + RESUME_SETTLE_S
    while True:
        status = await client.status()
        if status.paused_by != "you" or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(0.1)


def status_object(status: NodeStatus, info: ControlInfo) -> dict[str, Any]:
    """The machine-readable status: stable keys, `training` for a script's if."""
    wire = status_to_wire(status)
    out = {key: wire[key] for key in STATUS_JSON_KEYS}
    out["training"] = status.state in ACTIVE_STATES
    out["paused"] = status.state == "paused"
    out["engine"] = {"url": info.url, "pid": info.pid}
    return out


STATE_WORDS = {"stopped": "not training", "solo": "training solo", "joining": "joining the swarm",
               "in_swarm": "training in the swarm", "pausing": "pausing after this round", "paused": "paused",
               "leaving": "leaving the swarm"}


def status_text(status: NodeStatus) -> str:
    head = STATE_WORDS.get(status.state, status.state) + (f": {status.detail}" if status.detail else "")
    peers = status.peers
    model = status.model_name or status.model or "?"
    device = f" on {status.device}" if status.device else ""  # known once the model has loaded
    return f"{head}\nround {status.round} · {model}{device} · {peers} peer{'' if peers == 1 else 's'}"
