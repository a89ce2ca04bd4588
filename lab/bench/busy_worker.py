"""The two kinds of process `sapo bench busy` starts: the engine's rounds under one setting, and a competitor.

  python -m lab.bench.busy_worker engine ARGS_JSON   the node's round step and the held-out judge, at the
                                                      setting's priority, threads and (through the
                                                      environment the bench gives it) OpenMP wait policy
  python -m lab.bench.busy_worker compete N [ON OFF] a CPU-bound owner: an integer/float loop of N steps
                                                      per unit, one line per unit, until stopped (with ON
                                                      and OFF seconds: working ON, away OFF, again)

The engine worker loads the model and runs one warm-up round at normal priority (quietly: a busy
machine would otherwise make an idle-priority load the slowest part of the bench), then lowers every
thread it has to the setting's priority, prints `ready` and takes cases from stdin (one JSON line each): a case runs its rounds and the judge, reporting each as one
line prefixed with `@busy ` (libraries print to stdout too). A case ends early when its abort file
appears (checked before each round and before the judge): the bench's time cap.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from engine.machine import load as machine_load
from engine.machine.governor import ThreadGovernor
from engine.machine.load import apply_threads
from engine.models.backends import load_for_node
from engine.node.peer_groups import make_pool
from engine.sapo.step import PoolExchange, step
from engine.swarm.config import PoolConfig
from engine.tasks.library import heldout
from lab.bench.real_arm import judge, judge_mix, train_mix

PREFIX = "@busy "


def work_unit(steps: int) -> float:
    """A fixed integer and float workload: an LCG feeding a float accumulator (no memory traffic)."""
    x, y = 1, 0.0
    for _ in range(steps):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        y += (x % 1000) * 1e-3
    return y


def compete(steps: int, on_s: float = 0.0, off_s: float = 0.0) -> None:
    """Units until stopped; with `on_s` and `off_s`, an owner that comes and goes: units for `on_s`,
    then nothing for `off_s` (the units are the same work, so their times compare with a steady one's)."""
    window = time.monotonic()
    while True:
        if on_s and time.monotonic() - window >= on_s:
            time.sleep(off_s)
            window = time.monotonic()
        start = time.time()
        work_unit(steps)
        end = time.time()
        print(json.dumps({"start": start, "end": end, "s": end - start}), flush=True)


def say(event: str, **data: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **data}), flush=True)


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # not Linux: the process as a whole


def apply_priority(priority: str) -> str:
    """Every thread to the setting's priority. "nice N" is how the app started its engine before idle
    priority (psutil's nice on the child, whose threads inherited it); the rest is the engine's own."""
    if priority.startswith("nice "):
        for tid in _tids():
            os.setpriority(os.PRIO_PROCESS, tid, int(priority.split()[1]))
        return priority
    return machine_load.apply_priority(priority)


def thread_priorities() -> list[str]:
    """Linux: each thread's policy and nice value, e.g. "SCHED_IDLE/0" (the check that all were lowered)."""
    if not sys.platform.startswith("linux"):
        return []
    names = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_IDLE: "SCHED_IDLE", os.SCHED_BATCH: "SCHED_BATCH"}
    out = []
    for tid in _tids():
        try:
            out.append(f"{names.get(os.sched_getscheduler(tid), '?')}/{os.getpriority(os.PRIO_PROCESS, tid)}")
        except OSError:
            continue  # the thread ended meanwhile
    return sorted(set(out))


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _alternating() -> Any:
    """Rewards 0, 1, 0, ... within every group: each round trains on all its completions, so every case
    does the same work (a real verifier would skip the update for groups without signal)."""
    import itertools

    flip = itertools.count()
    return lambda question, completion: float(next(flip) % 2)


def load(args: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
    """(trainer, loaded, judge questions): SmolLM2 (or the seed) as the node runs it, cpu-real rounds."""
    from engine.models.llamacpp import LlamaCppConfig  # these bring torch: after the priority is set
    from engine.sapo.config import SapoConfig, preset
    from engine.sapo.trainer import Trainer

    # "split": the layout auto settles on for SmolLM2 (bench/generate.md), fixed so that no case pays
    # auto's trial calls of both layouts
    cfg_llama = LlamaCppConfig(threads=args["threads"] or 0, kv_layout="split")
    loaded = load_for_node(args["model"], "llamacpp", "cpu", Path(args["data_dir"]), llamacpp_cfg=cfg_llama)
    cfg = SapoConfig.from_dict(preset("cpu-real").to_dict() | {
        "prompt_style": loaded.prompt_style or "chat-fewshot", "prompt_shots": loaded.prompt_shots or 1,
        "num_external": 0, "eval_every": 0, "eval_every_s": 0.0, "checkpoint_every": 0})
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, train_mix(args["specialties"]), None, None,
                      seed=args["seed"], model_id=loaded.model_id, generator=loaded.generator,
                      reward_fn=_alternating())
    questions = heldout(judge_mix(args["specialties"]), args["judge_per_specialty"], cfg.eval_seed)
    return trainer, loaded, questions


class Pace:
    """The setting's threads: fixed, or the node's own governor (chosen before each round and again at
    every decode step and update chunk: engine.machine.governor)."""

    def __init__(self, args: dict[str, Any], generator: Any) -> None:
        self.fixed, self.cpu_cores, self.generator = args["threads"], args["cpu_cores"], generator
        self.governor: ThreadGovernor | None = None

    def fresh(self) -> None:
        """A new case: the load measured from now on (the node's first look after it starts)."""
        self.governor = ThreadGovernor(machine_load.ThreadPacer())

    @contextlib.contextmanager
    def running(self) -> Iterator[dict[str, Any]]:
        """One round (or the judge) at the setting's threads -> a dict the caller fills in afterwards
        with `threads` (the last choice), `threads_low`/`threads_high`, `thread_changes`, `others_busy`."""
        record: dict[str, Any] = {}
        if self.fixed:
            apply_threads("cpu", self.fixed, self.generator)
            yield record
            record.update(threads=int(self.fixed), threads_low=int(self.fixed), threads_high=int(self.fixed),
                          thread_changes=0, others_busy=None)
            return
        assert self.governor is not None
        with self.governor.governing("cpu", self.cpu_cores, self.generator):
            yield record
        done = self.governor.round_record()
        record.update({key: done[key] for key in ("threads", "threads_low", "threads_high", "thread_changes",
                                                  "others_busy")})


def run_case(trainer: Any, exchange: Any, pace: Pace, questions: list[Any], case: dict[str, Any]) -> None:
    abort = Path(case["abort_file"])
    pace.fresh()
    aborted = False
    for _ in range(case["rounds"]):
        if abort.exists():
            aborted = True
            break
        cpu0, start = _cpu_s(), time.time()
        with pace.running() as threads:
            phases = step(trainer, exchange).phase_seconds
        say("round", start=start, end=time.time(), **threads, cpu_s=_cpu_s() - cpu0,
            generate=phases.get("generate", 0.0), update=phases.get("update", 0.0), total=phases["total"])
    if case["judge"] and not aborted and not abort.exists():
        cpu0, start = _cpu_s(), time.time()
        with pace.running() as threads:
            judged = judge(trainer, questions, case["eval_k"], [9001])
        say("judge", start=start, end=time.time(), **threads, cpu_s=_cpu_s() - cpu0,
            seconds=time.time() - start, pass_at_1=judged["pass_at_1"])
    say("case_done")


def engine(args: dict[str, Any]) -> None:
    import torch

    trainer, loaded, questions = load(args)
    pace = Pace(args, loaded.generator)
    exchange = PoolExchange(make_pool(PoolConfig(), trainer.cfg.sampling.max_new_tokens, trainer.cfg.partial_credit,
                                      trainer.mix))
    pace.fresh()
    with pace.running():
        step(trainer, exchange)  # warm-up: first calls allocate the context and caches
    applied = apply_priority(args["priority"])  # every thread there is; threads started later inherit it
    say("ready", priority=applied, priority_now=machine_load.current_priority(), threads_now=thread_priorities(),
        wait_policy=os.environ.get(machine_load.WAIT_POLICY_ENV, "(libgomp default)"),
        torch_threads=torch.get_num_threads(), judge_questions=len(questions), model=loaded.model_id,
        backend=loaded.label)
    for line in sys.stdin:
        case = json.loads(line)
        if case.get("cmd") == "quit":
            break
        run_case(trainer, exchange, pace, questions, case)
    loaded.generator.close()


def main(argv: list[str]) -> int:
    if argv[0] == "compete":
        compete(int(argv[1]), *(float(a) for a in argv[2:4]))
    elif argv[0] == "engine":
        engine(json.loads(Path(argv[1]).read_text()))
    else:
        raise SystemExit(f"unknown role {argv[0]!r}: engine ARGS_JSON | compete STEPS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
