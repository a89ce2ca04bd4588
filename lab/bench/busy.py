"""`sapo bench busy`: the engine on a machine that is also in use, and what it costs the owner.

Per setting (old: how the app ran its engine before issue 32, 2 threads at nice 15 with libgomp's
default spin-then-sleep waits; new: the node's own choice of threads from the cores lent and free, at
idle priority, with passive waits) one engine process (lab/bench/busy_worker.py) loads the model
quietly and then runs cases: SmolLM2-135M `cpu-real` rounds through the node's round step (generate
and update apart; every completion trained, so every case does the same work) and the held-out judge,
quiet and beside 1 and 2 CPU-bound competitors (an integer/float loop the bench starts and stops).

The references are fixed thread counts on the quiet machine (settings "fixed-1" .. "fixed-P", idle
priority, passive waits, quiet case only). Ratios, within one run, never absolute times:
  ratio_to_free_capacity    measured / the time the best fixed count that fits the cores the owner
                            leaves free takes on a quiet machine (P - c free beside c competitors; an
                            owner that comes and goes leaves P cores part of the time and P - 1 the rest:
                            the reference is the time at that mix of rates). With no core free the
                            engine at idle priority waits, as it should: the case hits the time cap.
  ratio_to_best_fixed_idle  quiet cases: measured / the fastest fixed count's quiet time.
  owner_slowdown            a competitor's unit time beside the engine / its unit time alone, minus 1.
Writes bench/busy.{json,md,png}.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from engine import doctor
from engine.machine import load as machine_load
from engine.machine.hardware import probe
from engine.models import catalog
from engine.models.catalog import resolve_model_id
from engine.paths import REPO_ROOT
from engine.round_probe import stored_probe
from lab import BENCH_DIR
from lab.bench import save_results
from lab.bench.busy_report import plot, summarize, table
from lab.bench.busy_worker import PREFIX
from lab.bench.real_learning import SPECIALTIES

DESCRIPTION = "the engine beside the owner's CPU-bound work: rounds vs fair share, owner slowdown, old vs new settings"
LONG = True  # ~17 minutes on 2 cores with the defaults
# threads: fixed count, or 0 = the node's governor from cpu_cores (0 = automatic: every core that is free)
SETTINGS: dict[str, dict[str, Any]] = {
    "old": {"threads": 2, "cpu_cores": 0, "priority": "nice 15", "wait": "default"},  # before issue 32
    "reserve": {"threads": 0, "cpu_cores": -1, "priority": "idle", "wait": "passive"},  # one core kept back
    "new": {"threads": 0, "cpu_cores": 0, "priority": "idle", "wait": "passive"},
}
FIXED = "fixed-"  # "fixed-N": N threads, idle priority, passive waits, quiet only (the references)
BURSTY = (3.0, 3.0)  # the owner that comes and goes: seconds working, seconds away
WAIT_ENV = {"default": None, "passive": "PASSIVE", "active": "ACTIVE"}
SETTLE_S = 1.0  # competitors start before a case begins, so the node's first look sees them


def _cores() -> int:
    """The logical CPUs this run may use (the fair share's P)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _physical() -> int:
    return machine_load.ThreadPacer().physical


def setting_spec(name: str) -> dict[str, Any]:
    """A named setting, or "fixed-N" (N threads at the new setting's priority and waits)."""
    if name.startswith(FIXED) and name[len(FIXED):].isdigit() and int(name[len(FIXED):]) > 0:
        return {**SETTINGS["new"], "threads": int(name[len(FIXED):])}
    if name not in SETTINGS:
        raise ValueError(f"unknown setting {name!r}; known: {sorted(SETTINGS)} and fixed-N")
    return SETTINGS[name]


class Competitors:
    """c CPU-bound owner processes, each logging its units' times to a file."""

    def __init__(self, count: int, steps: int, work: Path, duty: tuple[float, float] | None = None) -> None:
        self.logs = [work / f"compete-{time.monotonic_ns()}-{i}.jsonl" for i in range(count)]
        self.procs = []
        comes_and_goes = [str(s) for s in duty] if duty else []
        for log in self.logs:
            with log.open("w") as out:
                self.procs.append(subprocess.Popen([sys.executable, "-m", "lab.bench.busy_worker", "compete",
                                                    str(steps), *comes_and_goes], cwd=REPO_ROOT, stdout=out))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            proc.wait(10)

    def units(self, start: float, end: float) -> list[float]:
        """Durations of the units that ran entirely inside [start, end]."""
        out = []
        for log in self.logs:
            for line in log.read_text().splitlines():
                try:
                    unit = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when the process was stopped
                if unit["start"] >= start and unit["end"] <= end:
                    out.append(unit["s"])
        return out


def _cpu_cores(spec: dict[str, Any]) -> int:
    """The setting's cpu_cores as the engine gets it (-1: all physical cores but one, the old automatic)."""
    return max(1, _physical() - 1) if spec["cpu_cores"] < 0 else spec["cpu_cores"]


def owner_baseline(count: int, steps: int, seconds: float, work: Path) -> float:
    """A competitor's median unit time with `count` of them and no engine."""
    comp = Competitors(count, steps, work)
    start = time.time() + SETTLE_S
    time.sleep(SETTLE_S + seconds)
    end = time.time()
    comp.stop()
    units = comp.units(start, end)
    if not units:
        raise RuntimeError(f"no competitor unit finished in {seconds:g} s: lower unit_steps")
    return statistics.median(units)


class Engine:
    """One engine worker process at one setting, driven case by case."""

    def __init__(self, name: str, args: dict[str, Any], work: Path, ready_timeout_s: float) -> None:
        spec = setting_spec(name)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop(machine_load.WAIT_POLICY_ENV, None)  # "default": libgomp's own spin-then-sleep
        wait = WAIT_ENV[spec["wait"]]
        if wait is not None:
            env[machine_load.WAIT_POLICY_ENV] = wait
        cpu_cores = _cpu_cores(spec)
        args = {**args, "threads": spec["threads"], "cpu_cores": cpu_cores, "priority": spec["priority"]}
        path = work / f"engine-{name}.json"
        path.write_text(json.dumps(args))
        self.log = work / f"engine-{name}.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab.bench.busy_worker", "engine", str(path)],
                                         cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.next_event(ready_timeout_s)
        if self.ready.get("event") != "ready":
            raise RuntimeError(f"engine {name} did not start: {self.ready}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                self.events.put(json.loads(line[len(PREFIX):]))
        self.events.put({"event": "exited"})

    def next_event(self, timeout_s: float) -> dict[str, Any]:
        try:
            event = self.events.get(timeout=max(timeout_s, 0.01))
        except queue.Empty:
            return {"event": "timeout"}
        if event["event"] == "exited":
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the engine worker exited (code {self.proc.wait()}):\n{tail}")
        return event

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send({"cmd": "quit"})
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run_case(engine: Engine, competitors: int, opts: dict[str, Any], work: Path,
             duty: tuple[float, float] | None = None) -> dict[str, Any]:
    """One case: competitors up (steady, or coming and going by `duty`), the engine's rounds and judge
    until done or the cap, competitors down."""
    abort = work / "abort"
    abort.unlink(missing_ok=True)
    comp = Competitors(competitors, opts["unit_steps"], work, duty)
    time.sleep(SETTLE_S if competitors else 0.0)
    go = time.time()
    engine.send({"cmd": "case", "rounds": opts["rounds"], "judge": True, "eval_k": opts["eval_k"],
                 "abort_file": str(abort)})
    events, capped_at = [], None
    cap = opts["cap_s"] if competitors else opts["quiet_cap_s"]  # the quiet case is every ratio's reference
    try:
        while True:
            left = go + cap - time.time() if capped_at is None else 600.0
            event = engine.next_event(left)
            if event["event"] == "timeout":  # the cap: the owner stops, the engine ends the case quietly
                if capped_at is not None:
                    raise RuntimeError("the engine did not end its case within 10 minutes of the cap")
                capped_at = time.time()
                comp.stop()
                abort.touch()
                continue
            if event["event"] == "case_done":
                end = capped_at or time.time()
                break
            events.append(event)
    finally:
        comp.stop()  # also when the engine failed: no competitor outlives the bench
    return {"competitors": competitors, "bursty": list(duty) if duty else None, "go": go, "end": end,
            "capped_at": capped_at, "events": events, "owner_units": comp.units(go, end)}


def doctor_estimates(model: str, names: list[str], work: Path) -> dict[str, Any]:
    """`sapo doctor`'s round for the cores each setting lends on this machine, quiet, as a fresh machine
    gets it: calibrated by its short probe (engine.round_probe, run here once per thread count), and
    from the catalog's rates alone."""
    spec, hw = catalog.get(resolve_model_id(model)), probe()
    out = {}
    for name in names:
        spec_settings = setting_spec(name)
        cores = spec_settings["threads"] or _cpu_cores(spec_settings)
        rep = doctor.report(hw, can_fetch=False, models=[spec], cpu_cores=cores)
        probe_dir = work / f"probe-{rep['lent']['threads']}"
        probed = stored_probe(probe_dir, spec.id, rep["lent"]["threads"]) or doctor.probe_pick(rep, probe_dir)
        lent = doctor.report(hw, can_fetch=False, models=[spec], cpu_cores=cores, probe_dir=probe_dir)["lent"]
        out[name] = {"round_seconds": lent["round_seconds"], "source": lent["source"], "threads": lent["threads"],
                     "catalog_round_seconds": rep["lent"]["round_seconds"], "probe_seconds": probed["probe_seconds"],
                     "assumes": lent["assumes"]}
    return out


def _progress(started: float, message: str) -> None:
    """A line on stderr per step: the bench runs ~15 minutes."""
    print(f"[{(time.time() - started) / 60:5.1f} min] {message}", file=sys.stderr, flush=True)


def _cases(name: str, counts: list[int],
           bursty: tuple[float, float] | None) -> list[tuple[int, tuple[float, float] | None]]:
    """A setting's cases in order (quiet first: the reference); a fixed count runs only quiet."""
    if name.startswith(FIXED):
        return [(0, None)]
    return [(c, None) for c in counts] + ([(1, bursty)] if bursty else [])


def run(out_dir: Path = BENCH_DIR, model: str = "smollm2-135m", settings: list[str] | None = None,
        competitors: list[int] | None = None, bursty: tuple[float, float] | None = BURSTY, rounds: int = 3, judge_per_specialty: int = 8,
        eval_k: int = 4, cap_s: float = 180.0, baseline_s: float = 15.0, unit_steps: int = 2_000_000, seed: int = 0,
        ready_timeout_s: float = 900.0, quiet_cap_s: float = 900.0) -> dict[str, Any]:
    """Each setting's cases run quiet first, then beside each count of `competitors`, then beside one
    that comes and goes (`bursty`: seconds working, seconds away; None: no such case). A case beside competitors ends at `cap_s` (censored), a quiet one at
    `quiet_cap_s`. Default settings: "new" and every fixed count up to the physical cores."""
    names = list(settings or ["new"] + [f"{FIXED}{t}" for t in range(1, _physical() + 1)])
    bursty = (float(bursty[0]), float(bursty[1])) if bursty else None
    counts = sorted(set(competitors if competitors is not None else [0, 1, 2]) | {0})
    for name in names:
        setting_spec(name)
    opts = {"rounds": rounds, "eval_k": eval_k, "cap_s": cap_s, "quiet_cap_s": quiet_cap_s, "unit_steps": unit_steps}
    started = time.time()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = {c: owner_baseline(c, unit_steps, baseline_s, work) for c in counts if c}
        if bursty and 1 not in baseline:
            baseline[1] = owner_baseline(1, unit_steps, baseline_s, work)
        args = {"model": model, "data_dir": str(work / "data"), "specialties": SPECIALTIES,
                "judge_per_specialty": judge_per_specialty, "seed": seed}
        _progress(started, "the doctor's estimates: a short probe per thread count")
        estimates = doctor_estimates(model, names, work)  # a fresh machine's doctor, before any engine
        raw: dict[str, Any] = {}
        for name in names:
            _progress(started, f"{name}: loading the model")
            engine = Engine(name, args, work, ready_timeout_s)
            try:
                cases = []
                for count, duty in _cases(name, counts, bursty):
                    what = f"beside {count} competitor(s)" + (f" coming and going {duty[0]:g} s / {duty[1]:g} s"
                                                              if duty else "")
                    _progress(started, f"{name}: {what}, {rounds} rounds and the judge")
                    cases.append(run_case(engine, count, opts, work, duty))
                    case = cases[-1]
                    _progress(started, f"{name}: {what}: {case['end'] - case['go']:.0f} s"
                              + (" (capped)" if case["capped_at"] else ""))
                raw[name] = {"ready": engine.ready, "cases": cases}
            finally:
                engine.close()
    meta = {"model": model, "cores": _cores(), "physical_cores": _physical(), "rounds": rounds,
            "judge_questions": judge_per_specialty * len(SPECIALTIES), "eval_k": eval_k, "cap_s": cap_s,
            "unit_steps": unit_steps, "owner_unit_s_alone": {str(c): s for c, s in baseline.items()},
            "settings": {n: setting_spec(n) for n in names}, "load_average_at_start": load_start,
            "load_average_at_end": os.getloadavg()[0], "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "wall_minutes": (time.time() - started) / 60, "doctor": estimates}
    return save_results(out_dir, "busy", summarize(raw, meta), table, plot)
