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
from engine.control.token import ControlInfo, TokenError, read_token
from engine.errors import SapoError
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
            status = await client.call("status")
            print(json.dumps(status_object(status, info)) if args.json else status_text(status))
            return 0
        if name == "finish":
            print("finishing the round in flight ...", file=sys.stderr, flush=True)
            await client.call("finish")
            status = await client.call("status")
            print(f"finished after round {status.get('round', 0)}: training stopped, the engine stays up "
                  "(`sapo resume` trains again)")
            return 0
        if name == "pause":
            await client.call("pause", {"after_round": True})
            status = await client.call("status")
            print("pausing: the round in flight finishes first" if status.get("state") == "pausing"
                  else status_text(status))
            return 0
        await client.call("resume")
        print(status_text(await _settled(client)))
        return 0


async def _settled(client: ControlClient) -> dict[str, Any]:
    """The status once the node has re-read its rules after a resume (a paused node wakes between
    checks), or after RESUME_SETTLE_S."""
    deadline = time.monotonic() + RESUME_SETTLE_S
    while True:
        status: dict[str, Any] = await client.call("status")
        if status.get("paused_by") != "you" or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(0.1)


def status_object(status: Any, info: ControlInfo) -> dict[str, Any]:
    """The machine-readable status: stable keys, `training` for a script's if."""
    raw = status if isinstance(status, dict) else {}
    out = {key: raw.get(key) for key in STATUS_JSON_KEYS}
    out["training"] = raw.get("state") in ("solo", "in_swarm", "joining", "pausing")
    out["paused"] = raw.get("state") == "paused"
    out["engine"] = {"url": info.url, "pid": info.pid}
    return out


STATE_WORDS = {"stopped": "not training", "solo": "training solo", "joining": "joining the swarm",
               "in_swarm": "training in the swarm", "pausing": "pausing after this round", "paused": "paused",
               "leaving": "leaving the swarm"}


def status_text(status: Any) -> str:
    raw = status if isinstance(status, dict) else {}
    state = str(raw.get("state", "?"))
    detail = str(raw.get("detail") or "")
    head = STATE_WORDS.get(state, state) + (f": {detail}" if detail else "")
    peers = raw.get("peers", 0)
    model = raw.get("model_name") or raw.get("model") or "?"
    device = f" on {raw['device']}" if raw.get("device") else ""  # known once the model has loaded
    return f"{head}\nround {raw.get('round', 0)} · {model}{device} · {peers} peer{'' if peers == 1 else 's'}"
