"""`sapo run`: the engine, a long-lived node process (headless). The GUI drives it over --control."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from engine.machine import load as machine_load
from engine.settings import ContributorSettings


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a node: train SAPO rounds, share rollouts with the swarm")
    p.add_argument("--headless", action="store_true", help="no GUI (the engine process; the default)")
    p.add_argument("--solo", action="store_true", help="train alone: no swarm links, J = 0")
    p.add_argument("--bootstrap", action="append", default=[], metavar="URL",
                   help="ws:// or wss:// (TLS) rendezvous server (repeatable)")
    p.add_argument("--ca", type=Path, default=None, metavar="FILE",
                   help="check wss:// bootstraps and the board's TLS servers against the CA certificates in "
                        "FILE (PEM) only: a swarm with its own CA. Default: the settings' ca_file, else the "
                        "system's CAs")
    p.add_argument("--peer", action="append", default=[], metavar="URL", help="ws:// peer to dial directly")
    p.add_argument("--nats", action="append", default=[], metavar="URL",
                   help="the swarm's board on a NATS cluster (nats:// or tls://host:port; repeatable). Default: the "
                        "one the bootstrap names")
    p.add_argument("--no-mdns", action="store_true", help="don't announce or browse the LAN")
    p.add_argument("--swarm", default=None, metavar="NAME",
                   help="the swarm to join on the LAN: mDNS links only to nodes announcing the same name "
                        "(lower-case letters, digits, '-'; default: public)")
    p.add_argument("--listen", default=None, metavar="HOST:PORT", help="peer listener (default 0.0.0.0:0)")
    p.add_argument("--data-dir", type=Path, default=None, help="identity, settings, store, checkpoints")
    p.add_argument("--rounds", type=int, default=0, help="leave after N rounds (default: run until stopped)")
    p.add_argument("--model", default=None,
                   help="catalog id or local model dir (default: the one last chosen in the app, else the one "
                        "`sapo doctor` picks for this machine, remembered)")
    p.add_argument("--preset", default="auto",
                   help="trainer preset: paper | cpu-small | cpu-real | auto (cpu-small for the seed, cpu-real "
                        "for pretrained models)")
    p.add_argument("--local", type=int, default=None, metavar="I", help="own questions per round")
    p.add_argument("--external", type=int, default=None, metavar="J", help="peers' groups per round")
    p.add_argument("--strategy", default=None, help="external groups: plain | positive-only | importance-weighted")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any trainer setting (SapoConfig field; JSON value), e.g. --set lr=5e-5")
    p.add_argument("--mix", default="rl", help="task mix preset: rl | seed-easy | paper")
    p.add_argument("--seed", type=int, default=0, help="this node's RNG seed")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default=None)
    p.add_argument("--backend", choices=("auto", "transformers", "llamacpp", "bnb-nf4", "bnb-int8"), default="auto",
                   help="generation/training backend (default: sapo doctor's fit for the model)")
    p.add_argument("--llamacpp-weights", choices=("auto", "f32", "f16", "bf16"), default="auto",
                   help="llama.cpp backend: float type of the base weights (auto: f32 when fully fine-tuned, "
                        "bf16 for a LoRA base on CPUs with bf16 dot products, else f16)")
    p.add_argument("--llamacpp-kv", choices=("auto", "split", "unified"), default="auto",
                   help="llama.cpp backend: KV cache layout (auto: measure both, keep the faster)")
    p.add_argument("--control", action="store_true",
                   help="serve the local control API (127.0.0.1, token in the data dir) for the GUI")
    p.add_argument("--control-port", type=int, default=0, help="control API port (default: any free)")
    p.add_argument("--paused", action="store_true",
                   help="start without training: the app's Join or `sapo resume` starts it (the settings' "
                        "start_paused instead comes up paused, waiting for Resume)")
    p.add_argument("--priority", choices=machine_load.PRIORITIES, default=None,
                   help="CPU priority: idle (default: runs only on cores nothing else wants; nice 19 where the OS "
                        "refuses), low (nice 19) or normal")
    p.add_argument("--supervised", action="store_true",
                   help="run the engine as a child and restart it when it dies (backoff; gives up after "
                        "repeated fast crashes); why it died goes to logs/last_crash.json")
    p.set_defaults(func=run)


def parse_listen(text: str | None) -> tuple[str, int]:
    if not text:
        return "0.0.0.0", 0
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SystemExit(f"--listen must be HOST:PORT, got {text!r}")
    return host, int(port)


def build_config(args: argparse.Namespace) -> Any:
    from engine.models.llamacpp import LlamaCppConfig
    from engine.node import NodeConfig
    from engine.paths import default_data_dir
    from engine.sapo.config import SapoConfig, preset
    from engine.swarm.config import DEFAULT_SWARM, SwarmConfig

    auto = args.preset == "auto"
    sapo = preset("cpu-small" if auto else args.preset)
    changes: dict[str, Any] = {}
    if args.local is not None:
        changes["num_local"] = args.local
    if args.external is not None:
        changes["num_external"] = args.external
    if args.strategy is not None:
        changes["external_strategy"] = args.strategy
    split = _swarm_split(sapo, args)  # in a swarm, half the round comes from peers by default (paper: 4/4)
    for item in args.overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            changes[key] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key] = raw
    cpu_real = preset("cpu-real")
    real = SapoConfig.from_dict(cpu_real.to_dict() | _swarm_split(cpu_real, args) | changes) if auto else None
    changes = split | changes
    sapo = SapoConfig.from_dict(sapo.to_dict() | changes) if changes else sapo
    host, port = parse_listen(args.listen)
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    settings = ContributorSettings.load(data_dir)
    model = args.model or settings.model or first_run_model(data_dir, settings)
    swarm = SwarmConfig(listen_host=host, listen_port=port, bootstrap_urls=tuple(args.bootstrap),
                        peer_urls=tuple(args.peer), board_urls=tuple(args.nats), mdns=not args.no_mdns,
                        ca_file=_ca_file(args.ca) or settings.ca_file, swarm_name=args.swarm or DEFAULT_SWARM)
    return NodeConfig(data_dir=data_dir, model=model,
                      mix=args.mix, sapo=sapo, real_sapo=real,
                      swarm=swarm, solo=args.solo, rounds=args.rounds, seed=args.seed, device=args.device,
                      backend=args.backend, llamacpp=LlamaCppConfig(weights=args.llamacpp_weights,
                                                                    kv_layout=args.llamacpp_kv))


def first_run_model(data_dir: Path, settings: ContributorSettings) -> str:
    """The model a new contributor trains: `sapo doctor`'s pick for this machine (SmolLM2-135M on a
    laptop CPU), remembered in the settings so that later starts and the app agree on it. The seed is
    the fallback only when the doctor cannot judge the machine."""
    from engine import doctor

    try:
        pick = str(doctor.report()["pick"]["model"])
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        print(f"sapo run: the doctor could not pick a model ({exc}); training the small seed model",
              file=sys.stderr)
        return "seed"
    print(f"sapo run: training {pick}, the model `sapo doctor` picks for this machine (the Machine tab "
          "changes it)", file=sys.stderr)
    dataclasses.replace(settings, model=pick).save(data_dir)
    return pick


def _ca_file(path: Path | None) -> str:
    """--ca, checked now: a CA file that cannot be used stops the command with what is wrong with it
    (the settings' ca_file is not: a node started by the app logs the reason at each dial instead)."""
    from engine.swarm.tls import TlsError, client_context

    if path is None:
        return ""
    try:
        client_context(path)
    except TlsError as exc:
        raise ValueError(f"--ca: {exc}") from exc
    return str(path.expanduser().resolve())


def _swarm_split(sapo: Any, args: argparse.Namespace) -> dict[str, Any]:
    """I/J of a preset in a swarm when the command line does not set them: half of its questions from
    peers; a preset of fewer than 4 (cpu-real's 2 x 16) keeps its own and takes as many again from
    peers (one own group of 16 would leave the curriculum and the update too little of its own).

    For a real model that is J = I of peers' answer groups (same base model, re-scored here, through the
    repeated-text and plausibility screens). The evidence (bench/swarm_learning.md, SmolLM2 swarms of 3
    nodes paired by seed with the same nodes alone, read at equal CPU-seconds): it beat solo on every
    seed in both settings (+0.055 every node on 2 of 4 specialties, +0.036 every node on all 4), while
    peers' frontier questions (`--set num_suggested=1 --external 0`) gained in the first setting only
    (+0.046, then +0.006) and both together did no better than answers alone."""
    if args.solo or args.external is not None or sapo.num_external:
        return {}
    if sapo.num_local < 4:
        return {"num_external": sapo.num_local}
    half = sapo.num_local // 2
    return {"num_local": sapo.num_local - half, "num_external": half}


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # First, before torch or llama.cpp load: their OpenMP runtime reads its wait policy once, at load.
    in_time = machine_load.set_passive_wait()
    applied = machine_load.apply_priority(args.priority or machine_load.default_priority())
    logging.getLogger("sapo.run").info("CPU priority: %s; OpenMP waits: %s", applied,
                                       os.environ[machine_load.WAIT_POLICY_ENV].lower()
                                       + ("" if in_time else " (from the next start: already loaded)"))
    if args.supervised:
        return supervise(args)
    try:
        config = build_config(args)
    except ValueError as exc:
        raise SystemExit(f"sapo run: {exc}") from exc
    return asyncio.run(serve(config, control=args.control, control_port=args.control_port,
                             start_paused=args.paused))


def supervise(args: argparse.Namespace) -> int:
    """This same command line without --supervised, as a supervised child (engine/supervisor.py)."""
    from engine.autostart import self_command
    from engine.paths import default_data_dir
    from engine.supervisor import Supervisor

    data_dir = (args.data_dir or default_data_dir()).expanduser()
    argv = sys.argv[1:]
    child = [*self_command(), *[a for a in argv if a != "--supervised"]]
    if args.data_dir is None:
        child += ["--data-dir", str(data_dir)]  # the crash record and the engine share one data dir
    sup = Supervisor(child, data_dir, say=lambda text: print(text, file=sys.stderr, flush=True))
    sup.install_signal_handlers()
    return sup.run()


async def serve(config: Any, *, control: bool, control_port: int = 0, start_paused: bool = False) -> int:
    from engine.node import Node

    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C raises KeyboardInterrupt instead
            pass
    server = await _start_control(node, config.data_dir, control_port, stop.set) if control else None
    _print_progress_lines(node)
    try:
        await _start(node, start_paused, control)
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(node.crashed.wait())]
        if not control:  # without a GUI to ask for more, the process ends with its rounds
            waiters.append(asyncio.ensure_future(node.finished.wait()))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
    finally:
        await node.leave()
        if server is not None:
            await server.close()
            from engine.control.token import remove_control_info

            remove_control_info(config.data_dir, os.getpid())
        node.store.close()
    if node.crashed.is_set():
        from engine.supervisor import EXIT_ENGINE_CRASHED

        return EXIT_ENGINE_CRASHED  # training raised: a supervisor restarts this engine
    if node.identity_conflict:
        from engine.supervisor import EXIT_NO_RESTART

        return EXIT_NO_RESTART
    return 1 if node.error else 0


async def _start(node: Any, stopped: bool, control: bool) -> None:
    """Join, or not: `--paused` leaves the node stopped for the app's Join; the start_paused setting
    holds it paused until a Resume, which needs the control API to arrive."""
    if stopped:
        return
    if node.settings.start_paused and control:
        node.hold()
        return
    if node.settings.start_paused:
        logging.getLogger("sapo.run").warning("start_paused is set, but without --control nothing could "
                                              "resume this engine: training now")
    await node.join()


async def _start_control(node: Any, data_dir: Path, port: int, on_shutdown: Any) -> Any:
    """The GUI's `shutdown` request (keep-running-on-close off) ends this process cleanly."""
    from engine.control.server import ControlServer
    from engine.control.token import create_token, write_control_info

    server = ControlServer(node, create_token(data_dir), port=port, on_shutdown=on_shutdown)
    url = await server.start()
    write_control_info(data_dir, url, os.getpid())
    logging.getLogger("sapo.control").info("control API on %s (token in %s)", url, data_dir)
    return server


def _print_progress_lines(node: Any) -> None:
    """One line per round and per evaluation on stdout: what a headless contributor watches."""
    from engine.events import EvalCompleted, RoundCompleted, StateChanged

    def show(event: Any) -> None:
        if isinstance(event, RoundCompleted):
            m = event.metrics
            print(f"round {event.round:5d}  reward {m.get('reward_mean', 0.0):.3f}  "
                  f"trained on {event.num_local} own + {event.num_external} peers' groups  "
                  f"{event.phase_seconds.get('total', 0.0):.1f}s", flush=True)
        elif isinstance(event, EvalCompleted):
            print(f"eval  round {event.round}: pass@1 {event.pass1:.3f}  pass@{event.k} {event.passk:.3f}",
                  flush=True)
        elif isinstance(event, StateChanged):
            print(f"state {event.state}{': ' + event.detail if event.detail else ''}", flush=True)

    node.bus.add_listener(show)
