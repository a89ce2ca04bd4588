"""`sapo doctor`: this machine, every catalog model's training fit, and the pick, as one object."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.machine.hardware import GIB, CpuInfo, GpuInfo, HardwareProfile, mps_default_budget, probe
from engine.machine.load import choose_threads, lent_cores
from engine.models import catalog, fit
from engine.round_probe import probe_like_a_node, save_probe, stored_probe

DEFAULT_MAX_ROUND_SECONDS = 300.0  # "a few minutes" per paper-sized round suits a contributor
# Speed each thread past the first adds, as a fraction of one core's, on these small models: a SmolLM2
# cpu-real round went 12.4 -> 7.2 s from 1 to 2 threads on a quiet 2-core machine (1.72x; generation
# alone scales less, 3.9 -> 2.3 s, the torch update more, 8.5 -> 4.8 s), bench/busy.md, which compares
# the resulting estimate with measured rounds.
THREAD_GAIN = 0.7
CALIBRATION_ROUNDS = 32  # the newest measured rounds a calibration reads
MIN_CALIBRATION_ROUNDS = 3  # fewer than this (with an update in them) and the catalog's estimate stands


def hypothetical(device: str, memory_gb: float, cores: int = 8, bf16: bool = True) -> HardwareProfile:
    """A machine like ... : `memory_gb` is GPU memory on CUDA, unified memory on MPS, RAM on CPU."""
    mem = int(memory_gb * GIB)
    ram = mem if device in ("cpu", "mps") else max(mem, 16 * GIB)
    cpu = CpuInfo(name=f"{cores}-core CPU", physical_cores=cores, logical_cores=cores * 2,
                  ram_total_bytes=ram, ram_available_bytes=int(ram * 0.7) if device == "cpu" else ram)
    if device == "cuda":
        gpu = GpuInfo(0, f"{memory_gb:g} GB CUDA GPU", mem, int(mem * 0.95), (8, 6) if bf16 else (7, 5))
        return HardwareProfile(kind="cuda", cpu=cpu, gpus=(gpu,))
    if device == "mps":
        return HardwareProfile(kind="mps", cpu=cpu, mps_budget_bytes=mps_default_budget(mem))
    return HardwareProfile(kind="cpu", cpu=cpu)


def can_fetch_models() -> bool:
    """Whether hub downloads are allowed (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE switch them off)."""
    return not any(os.environ.get(v, "").lower() in ("1", "true", "yes")
                   for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


HUB_UP, HUB_DOWN, HUB_OFF = "reachable", "unreachable", "downloads off"


def hub_status(timeout_s: float = 1.5) -> str:
    """Whether the model hub answers: downloads switched off, a TCP connect to it (HF_ENDPOINT, else
    huggingface.co) within `timeout_s`, or not."""
    if not can_fetch_models():
        return HUB_OFF
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return HUB_UP
    except OSError:
        return HUB_DOWN


def availability(spec: catalog.ModelSpec, hub: str) -> str:
    """What the Machine tab says of one model: on this machine, downloadable now, or why not."""
    if spec.local_path is not None:
        return "installed"
    if (spec.hf_repo or spec.gguf_repo) is None:
        return "not installed"
    return {HUB_UP: "downloadable", HUB_OFF: "not installed (downloads are off)"}.get(
        hub, "not installed (no model hub reachable)")


def thread_speedup(threads: int) -> float:
    return 1.0 + THREAD_GAIN * (max(1, threads) - 1)


def lent_seconds(round_seconds: float, hw: HardwareProfile, threads: int) -> float:
    """A round estimated for every core (fit's CPU rates are per core and scale linearly), on `threads`
    threads instead, at the measured gain per thread. A GPU's round does not follow the CPU threads."""
    if hw.kind != "cpu":
        return round_seconds
    return round_seconds * max(1, hw.cpu.physical_cores) / thread_speedup(threads)


def lent_estimate(hw: HardwareProfile, pick_seconds: float, cpu_cores: int, busy_cores: float | None) -> dict[str, Any]:
    """The round time for the cores the contributor lends (quiet), and for the threads the engine would
    choose now beside the load measured (`busy_cores`; None: not measured). Says what it assumed."""
    physical = hw.cpu.physical_cores
    lent = lent_cores(cpu_cores, physical)
    out: dict[str, Any] = {
        "cpu_cores_setting": cpu_cores, "cores_lent": lent, "threads": lent,
        "round_seconds": round(lent_seconds(pick_seconds, hw, lent), 1),
        "assumes": (f"{lent} thread(s) on {lent} of {physical} physical cores"
                    + (" (automatic: every core the owner leaves free)" if cpu_cores == 0 else "")
                    + f", nothing else busy; +{THREAD_GAIN:g} core's speed per thread past the first"),
        "busy_cores": busy_cores, "threads_now": None, "round_seconds_now": None}
    if busy_cores is not None:
        now = choose_threads(lent, physical, busy_cores)
        free = max(physical, lent) - busy_cores
        out["threads_now"] = now
        # at idle priority the engine gets only what the owner leaves: with no core free it waits
        out["round_seconds_now"] = round(lent_seconds(pick_seconds, hw, now), 1) if free >= 0.5 else None
    return out


def measured_round(rows: list[dict[str, Any]], shape: fit.RoundShape) -> dict[str, Any] | None:
    """This machine's own measured rounds of one model (the store's rows, oldest first) -> the round of
    `shape` they imply: the median generation (with scoring and preparing) plus the measured update
    time per trained completion for every completion of the shape trained (the catalog's estimate
    counts them all; a real round skips groups without signal). None with too few rounds to tell."""
    rows = [r for r in rows[-CALIBRATION_ROUNDS:] if (r.get("seconds_total") or 0) > 0]
    trained = [r for r in rows if (r.get("rows_trained") or 0) > 0 and (r.get("seconds_update") or 0) > 0]
    if len(rows) < MIN_CALIBRATION_ROUNDS or len(trained) < MIN_CALIBRATION_ROUNDS:
        return None
    before_update = sorted(sum(float(r.get(f"seconds_{p}") or 0.0) for p in ("generate", "score", "prepare"))
                           for r in rows)
    per_row = sum(float(r["seconds_update"]) for r in trained) / sum(float(r["rows_trained"]) for r in trained)
    generate = before_update[len(before_update) // 2]
    round_s = generate + per_row * shape.questions * shape.completions
    return {"rounds": len(rows), "generate_seconds": round(generate, 2), "update_seconds_per_completion":
            round(per_row, 4), "round_seconds": round(round_s, 1)}


def stored_rounds(store: Any) -> tuple[str, list[dict[str, Any]]] | None:
    """(the model this machine trains, its newest rounds) from a node's store, for `report(measured=)`."""
    model = store.current_model()
    return None if model is None else (model, store.rounds(model=model, limit=CALIBRATION_ROUNDS))


def calibrate(rep: dict[str, Any], model: str, measured: dict[str, Any], source: str = "measured") -> None:
    """Scale `rep`'s CPU-bound estimates by what this machine measured for `model` (a catalog id in
    the report): every model's round is assumed off by the same factor as the one measured. `source`:
    "measured" (the node's own rounds) or "probed" (engine.round_probe's timed round)."""
    entry = next((c for c in rep["candidates"] if c["model"] == model and c["round_seconds"]), None)
    if entry is None or not entry["round_seconds_lent"]:
        return
    factor = measured["round_seconds"] / entry["round_seconds_lent"]
    for c in rep["candidates"]:
        c["round_seconds_lent"] = round(c["round_seconds_lent"] * factor, 1)
    lent = rep["lent"]
    for key in ("round_seconds", "round_seconds_now"):
        if lent[key] is not None:
            lent[key] = round(lent[key] * factor, 1)
    rep["pick"]["round_seconds_lent"] = lent["round_seconds"]
    lent["source"] = source
    lent["calibration"] = {"model": model, "factor": round(factor, 3), **measured}


def report(hw: HardwareProfile | None = None, shape: fit.RoundShape | None = None,
           can_fetch: bool | None = None, max_round_seconds: float = DEFAULT_MAX_ROUND_SECONDS,
           models: list[catalog.ModelSpec] | None = None, cpu_cores: int = 0,
           busy_cores: float | None = None, measured: tuple[str, list[dict[str, Any]]] | None = None,
           probe_dir: Path | None = None) -> dict[str, Any]:
    """`can_fetch` None: ask the hub (`hub_status`); True / False: assume it answers / is off.
    `cpu_cores`: the contributor's setting (0 = automatic); `busy_cores`: cores other work keeps busy
    now, if measured. "lent" is the round for those cores, "round_seconds" fit's for every core.
    `measured`: (model id, the store's rounds of it on this machine): enough of them calibrate the
    estimates ("lent"'s `source` says "measured"); without them, a probe stored in `probe_dir` for the
    pick and these threads does ("probed"); else "estimated" from the catalog's rates."""
    hw = hw or probe()
    hub = hub_status() if can_fetch is None else HUB_UP if can_fetch else HUB_OFF
    fetch = hub == HUB_UP
    specs = models or catalog.catalog()
    shapes = {spec.id: shape or fit.shape_for(spec, hw) for spec in specs}  # the round each would run
    candidates = [e for spec in specs for e in fit.assess(spec, hw, shapes[spec.id], fetch)]
    by_id = {spec.id: spec for spec in specs}
    chosen = fit.pick(candidates, max_round_seconds)
    shape = shapes[chosen.model]
    keys = ("model", "backend", "quantization", "estimated_bytes", "budget_bytes", "verdict", "reason")
    lent = lent_estimate(hw, chosen.round_seconds, cpu_cores, busy_cores)
    threads = lent["threads"]
    rep = {
        "device": hw.to_dict(),
        "round": {"questions": shape.questions, "completions": shape.completions,
                  "prompt_tokens": shape.prompt_tokens, "max_new_tokens": shape.max_new_tokens,
                  "micro_batch": shape.micro_batch, "max_round_seconds": max_round_seconds},
        "can_fetch": fetch,
        "hub": hub,
        "pick": {k: getattr(chosen, k) for k in keys} | {"round_seconds": chosen.round_seconds,
                                                         "round_seconds_lent": lent["round_seconds"]},
        "lent": lent,
        "candidates": [e.to_dict() | {"availability": availability(by_id[e.model], hub),
                                      "round_seconds_lent": round(lent_seconds(e.round_seconds, hw, threads), 1)}
                       for e in candidates],
        "fast_paths": fast_paths(),
    }
    lent["source"] = "estimated"
    if hw.kind != "cpu":
        return rep
    calibration = measured_round(measured[1], shape) if measured is not None else None
    if calibration is not None and measured is not None:
        calibrate(rep, measured[0], calibration)
        return rep  # the machine's own rounds: no need to read a probe
    probed = stored_probe(probe_dir, chosen.model, threads) if probe_dir is not None else None
    if probed is not None:
        calibrate(rep, chosen.model, probed, "probed")
    return rep


def probe_pick(rep: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """Time a round of `rep`'s pick at its lent threads and round shape (engine.round_probe) and
    store it in `data_dir`, where the next report with `probe_dir=data_dir` reads it. ProbeError when
    the probe cannot run here."""
    shape = fit.RoundShape(**{k: rep["round"][k] for k in ("questions", "completions", "prompt_tokens",
                                                             "max_new_tokens", "micro_batch")})
    probe = probe_like_a_node(catalog.resolve_model_id(rep["pick"]["model"]), shape, rep["lent"]["threads"],
                              data_dir)
    save_probe(data_dir, probe)
    return probe


def fast_paths() -> dict[str, Any]:
    """This machine's software speed-ups (not the hypothetical device's): llama.cpp for generation,
    with bf16 weights where its build has hardware bf16, and bf16 autocast for LoRA updates on CPU."""
    from engine.machine.hardware import torch_cpu_bf16

    try:
        from engine.models.llama_lib import build_label, load
        from engine.models.llamacpp import native_bf16

        llamacpp: str | None = build_label(load())
        llamacpp_bf16 = native_bf16()
    except (ImportError, OSError, RuntimeError):  # not installed, or its library does not load here: "none"
        llamacpp, llamacpp_bf16 = None, False
    return {"llamacpp": llamacpp, "llamacpp_bf16": llamacpp_bf16, "torch_cpu_bf16": torch_cpu_bf16()}
