"""`sapo doctor`: what this machine is and which model it can afford to train."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.machine.load import LoadProbe
from engine.paths import default_data_dir
from engine.settings import ContributorSettings
from engine.store import Store
from engine.supervisor import read_last_crash


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="detect this machine and pick the model it can train")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--device", choices=("cuda", "mps", "cpu"), help="size for a machine like this instead")
    p.add_argument("--memory-gb", type=float, help="its GPU / unified / RAM memory (with --device)")
    p.add_argument("--cores", type=int, default=8, help="its physical CPU cores (with --device)")
    p.add_argument("--offline", action="store_true", help="only models already on this machine")
    p.add_argument("--data-dir", type=Path, default=None, help="the node's data dir (for its last crash)")
    p.add_argument("--max-round-seconds", type=float, default=None,
                   help="longest acceptable paper-sized round (default 300)")
    p.add_argument("--cpu-cores", type=int, default=None, metavar="N",
                   help="cores lent to the engine for the round estimate (default: the data dir's setting; "
                        "0 = automatic: every core your own work leaves free)")
    probe = p.add_mutually_exclusive_group()
    probe.add_argument("--probe", action="store_true",
                       help="time a round of the pick now (under a minute) even if a probe is stored")
    probe.add_argument("--no-probe", action="store_true",
                       help="never probe: before this machine has rounds, use the catalog's rates")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine import doctor

    if args.memory_gb is not None and args.device is None:
        raise SystemExit("--memory-gb needs --device")
    if args.device and args.memory_gb is None:
        raise SystemExit("--device needs --memory-gb")
    if args.memory_gb is not None and not 0 < args.memory_gb < 100_000:
        raise SystemExit("--memory-gb must be a positive number of GB")
    hw = doctor.hypothetical(args.device, args.memory_gb, args.cores) if args.device else None
    # A hypothetical machine assumes the hub answers (unless downloads are off); this one asks it.
    fetch = False if args.offline else (doctor.can_fetch_models() if hw is not None else None)
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    if args.cpu_cores is not None and not 0 <= args.cpu_cores <= 1024:
        raise SystemExit("--cpu-cores must be between 0 and 1024")
    cores = args.cpu_cores if args.cpu_cores is not None else ContributorSettings.load(data_dir).cpu_cores
    # this machine's load now (half a second's look); a hypothetical machine is assumed quiet
    busy = None if hw is not None else round(LoadProbe().others_busy(), 2)
    kwargs: dict[str, Any] = {"hw": hw, "can_fetch": fetch, "cpu_cores": cores, "busy_cores": busy}
    if args.max_round_seconds is not None:
        kwargs["max_round_seconds"] = args.max_round_seconds
    if hw is None and (data_dir / "node.db").exists():  # this machine's own rounds calibrate the estimate
        with Store(data_dir / "node.db") as store:
            kwargs["measured"] = doctor.stored_rounds(store)
    if hw is None:  # this machine: a probe stored in its data dir calibrates the estimate
        kwargs["probe_dir"] = data_dir
    rep = doctor.report(**kwargs)
    if hw is None and wants_probe(rep, args) and probe_now(rep, data_dir):
        rep = doctor.report(**kwargs | {"can_fetch": rep["can_fetch"]})  # the hub asked once
    rep["last_crash"] = read_last_crash(data_dir)
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print_table(rep)
    return 0


def wants_probe(rep: dict[str, Any], args: argparse.Namespace) -> bool:
    """Probe when asked to, or when nothing better than the catalog's rates stands (no measured rounds,
    no stored probe) and the pick is on this machine, on its CPU."""
    if args.no_probe or rep["device"]["kind"] != "cpu":
        return False
    if args.probe:
        return True
    pick: dict[str, Any] = next((c for c in rep["candidates"] if c["model"] == rep["pick"]["model"]), {})
    return rep["lent"]["source"] == "estimated" and pick.get("availability") == "installed"


def probe_now(rep: dict[str, Any], data_dir: Path) -> bool:
    """Run and store the probe for the pick at the lent threads; says on stderr what it does, and why
    not when it cannot (the estimate then stays the catalog's)."""
    import sys

    from engine import doctor
    from engine.round_probe import ProbeError

    print(f"Probing this machine: a round of {rep['pick']['model']} on {rep['lent']['threads']} "
          "thread(s) (under a minute, once) ...", file=sys.stderr, flush=True)
    try:
        doctor.probe_pick(rep, data_dir)
    except ProbeError as exc:
        print(f"Probe skipped: {exc}", file=sys.stderr)
        return False
    return True


def print_table(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    gib = 1024**3
    dev = rep["device"]
    console = Console(width=max(120, Console().width))
    console.print(f"[bold]Device[/] {dev['kind'].upper()}: {dev['name']} · budget "
                  f"{dev['budget_bytes'] / gib:.1f} GiB · {dev['cpu']['physical_cores']} cores · RAM "
                  f"{dev['cpu']['ram_total_bytes'] / gib:.1f} GiB")
    bat = dev["battery"]
    idle = dev["idle_seconds"]
    console.print(f"Battery: {'unknown' if bat['present'] is None else 'none' if not bat['present'] else bat}"
                  f" · user idle: {'unknown' if idle is None else f'{idle:.0f} s'}")
    table = Table(title="Training fit for one round "
                  f"({rep['round']['questions']}×{rep['round']['completions']}, "
                  f"{rep['round']['max_new_tokens']} new tokens)")
    lent = rep["lent"]
    for col in ("model", "backend", "quant", "training", "estimate GiB", "verdict", "round s (all cores)",
                f"round s ({lent['threads']} thr)", "here"):
        table.add_column(col)
    for c in rep["candidates"]:
        table.add_row(c["model"], c["backend"], c["quantization"], "full" if c["full_finetune"] else "LoRA",
                      f"{c['estimated_bytes'] / gib:.2f}", c["verdict"], f"{c['round_seconds']:.0f}",
                      f"{c['round_seconds_lent']:.0f}", c.get("availability") or ("yes" if c["available"] else "-"))
    console.print(table)
    fast = rep.get("fast_paths") or {}
    gen = (f"llama.cpp from {fast['llamacpp']}" + (" (bf16 weights)" if fast.get("llamacpp_bf16") else "")
           if fast.get("llamacpp") else "llama.cpp not installed (pip install xllamacpp)")
    upd = "bf16 autocast for LoRA updates" if fast.get("torch_cpu_bf16") else "fp32 updates (no native bf16)"
    console.print(f"Fast paths on this machine: {gen} · CPU: {upd}")
    pick = rep["pick"]
    console.print(f"[bold green]Pick:[/] {pick['model']} via {pick['backend']} ({pick['quantization']}) — "
                  f"{pick['reason']}")
    console.print(lent_line(pick["model"], lent))
    if "last_crash" in rep:
        from rich.markup import escape

        from engine.supervisor import crash_text

        crash = rep["last_crash"]
        console.print(f"[bold red]Last crash:[/] {escape(crash_text(crash))}" if crash else "Last crash: none recorded")


def lent_line(model: str, lent: dict[str, Any]) -> str:
    """The round time for the cores lent, what it assumed and where it comes from (this machine's
    measured rounds, or the catalog's rates); then the same beside today's load."""
    calibration = lent.get("calibration")
    if calibration and lent.get("source") == "probed":
        source = (f"probed here: a round of {calibration['model']}, the catalog's estimate "
                  f"x{calibration['factor']:.2f}; your own rounds replace it once there are some")
    elif calibration:
        source = (f"measured here: {calibration['rounds']} rounds of {calibration['model']}, "
                  f"the catalog's estimate x{calibration['factor']:.2f}")
    else:
        source = "estimated from the catalog's rates"
    line = (f"Round for the cores you lend: ~{lent['round_seconds']:.0f} s for {model} ({lent['assumes']}; "
            f"{source})")
    if lent["busy_cores"] is None:
        return line
    if lent["round_seconds_now"] is None:
        return line + (f". Now other work keeps {lent['busy_cores']:.1f} cores busy: no core is free, "
                       "so the engine waits (idle priority)")
    return line + (f". Now other work keeps {lent['busy_cores']:.1f} cores busy: {lent['threads_now']} "
                   f"thread(s), ~{lent['round_seconds_now']:.0f} s")
