"""What the engine asks of the OS (priority, OpenMP wait policy) and how it chooses its threads.

Linux calls are made for real, in child processes (a lowered priority cannot be raised back);
Windows and macOS calls are checked through stand-ins for their system libraries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.machine import load as machine_load
from engine.machine.load import LoadProbe, PauseTimer, ThreadPacer, choose_threads, lent_cores
from engine.models import llama_lib

ROOT = Path(__file__).resolve().parent.parent
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling calls")

# A child that starts a thread, applies a level, starts another, then reports every thread's policy.
REPORT = """
import json, os, sys, threading, psutil
from engine.machine import load as machine_load
if sys.argv[2] == "refuse-idle":
    def refuse(*a):
        raise PermissionError(1, "Operation not permitted")
    os.sched_setscheduler = refuse
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
applied = machine_load.apply_priority(sys.argv[1])
after = threading.Thread(target=stop.wait); after.start()
tids = [int(t) for t in os.listdir("/proc/self/task")]
out = {"applied": applied, "policies": [os.sched_getscheduler(t) for t in tids],
       "nices": [os.getpriority(os.PRIO_PROCESS, t) for t in tids], "threads": len(tids),
       "ionice": int(psutil.Process().ionice().ioclass), "now": machine_load.current_priority()}
stop.set()
print(json.dumps(out))
"""


def _child(level: str, mode: str = "") -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", REPORT, level, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return dict(json.loads(out.stdout))


@linux
def test_idle_priority_puts_every_thread_in_sched_idle_and_later_threads_inherit_it() -> None:
    out = _child("idle")
    assert out["threads"] == 3 and out["policies"] == [os.SCHED_IDLE] * 3  # main, one before, one after
    assert out["applied"].startswith("SCHED_IDLE") and out["now"] == "SCHED_IDLE"
    assert out["ionice"] == psutil.IOPRIO_CLASS_IDLE


@linux
def test_refused_idle_priority_falls_back_to_nice_19_on_every_thread() -> None:
    out = _child("idle", "refuse-idle")
    assert out["policies"] == [os.SCHED_OTHER] * 3 and out["nices"] == [19] * 3
    assert out["applied"].startswith("nice 19") and "SCHED_IDLE refused" in out["applied"]


@linux
def test_low_is_nice_19_and_normal_asks_nothing() -> None:
    low = _child("low")
    assert low["policies"] == [os.SCHED_OTHER] * 3 and low["nices"] == [19] * 3
    normal = _child("normal")
    assert normal["applied"] == "normal" and normal["nices"] == [os.getpriority(os.PRIO_PROCESS, 0)] * 3


@linux
def test_another_process_is_lowered_by_pid() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert machine_load.apply_priority("idle", pid=proc.pid).startswith("SCHED_IDLE")
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
    finally:
        proc.kill()
        proc.wait()


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="priority"):
        machine_load.apply_priority("realtime")


class FakeKernel32:
    def __init__(self, ok: bool = True) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.ok = ok

    def GetCurrentProcess(self) -> int:
        return -1

    def OpenProcess(self, access: int, inherit: bool, pid: int) -> int:
        self.calls.append(("OpenProcess", access, inherit, pid))
        return 77

    def SetPriorityClass(self, handle: int, cls: int) -> int:
        self.calls.append(("SetPriorityClass", handle, cls))
        return int(self.ok)

    def CloseHandle(self, handle: int) -> int:
        self.calls.append(("CloseHandle", handle))
        return 1


def test_windows_asks_for_the_idle_priority_class(monkeypatch: pytest.MonkeyPatch) -> None:
    k32 = FakeKernel32()
    monkeypatch.setattr(machine_load, "_kernel32", lambda: k32)
    assert machine_load.apply_priority("idle", platform="win32") == "IDLE_PRIORITY_CLASS"
    assert k32.calls == [("SetPriorityClass", -1, 0x40)]  # this process: the pseudo-handle, nothing to close
    k32.calls.clear()
    assert machine_load.apply_priority("low", pid=4242, platform="win32") == "BELOW_NORMAL_PRIORITY_CLASS"
    assert k32.calls == [("OpenProcess", 0x0200 | 0x1000, False, 4242), ("SetPriorityClass", 77, 0x4000),
                         ("CloseHandle", 77)]
    refused = FakeKernel32(ok=False)
    monkeypatch.setattr(machine_load, "_kernel32", lambda: refused)
    assert machine_load.apply_priority("idle", platform="win32").startswith("normal (SetPriorityClass refused")


class FakeLibc:
    def __init__(self, rc: int) -> None:
        self.rc, self.calls = rc, []  # type: ignore[var-annotated]

    def setpriority(self, which: int, who: int, prio: int) -> int:
        self.calls.append((which, who, prio))
        return self.rc


@pytest.mark.skipif(sys.platform == "win32", reason="the nice fallback is POSIX's setpriority")
def test_macos_asks_for_background_then_nice_19_if_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc(0)
    niced: list[tuple[int, int, int]] = []
    monkeypatch.setattr(machine_load, "_libc", lambda: libc)
    monkeypatch.setattr(machine_load.os, "setpriority", lambda *a: niced.append(a))
    assert machine_load.apply_priority("idle", platform="darwin") == "PRIO_DARWIN_BG"
    assert libc.calls == [(4, 0, 0x1000)] and niced == []  # PRIO_DARWIN_PROCESS, this process, PRIO_DARWIN_BG
    libc.rc = -1
    assert machine_load.apply_priority("idle", pid=99, platform="darwin").startswith("nice 19 (background refused")
    assert libc.calls[-1] == (4, 99, 0x1000) and niced == [(os.PRIO_PROCESS, 99, 19)]
    assert machine_load.apply_priority("low", platform="darwin") == "nice 19"
    assert niced[-1] == (os.PRIO_PROCESS, 0, 19)


def test_the_launchers_level_is_the_default_and_idle_otherwise() -> None:
    assert machine_load.default_priority({}) == "idle"
    assert machine_load.default_priority({"SAPO_PRIORITY": "normal"}) == "normal"
    assert machine_load.default_priority({"SAPO_PRIORITY": "bogus"}) == "idle"


def test_passive_wait_keeps_a_value_someone_chose() -> None:
    assert machine_load.passive_wait_env({"A": "1"}) == {"A": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert machine_load.passive_wait_env({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


# libgomp prints what it read at load with OMP_DISPLAY_ENV=VERBOSE: a passive policy means no spinning.
GOMP = """
import sys
from engine.machine import load as machine_load
early = machine_load.set_passive_wait() if sys.argv[1] == "early" else None
import torch
from engine.models import llama_lib
llama_lib.load()
late = machine_load.set_passive_wait() if sys.argv[1] == "late" else None
torch.ones(64, 64) @ torch.ones(64, 64)
print(early, late)
"""


@linux
@pytest.mark.parametrize(("when", "spins", "in_time"), [("early", "0", "True None"), ("late", "300000", "None False")])
def test_the_wait_policy_reaches_torchs_and_llamacpps_openmp_only_before_they_load(
        when: str, spins: str, in_time: str) -> None:
    try:
        llama_lib.library_path()
    except llama_lib.LlamaLibError:
        pytest.skip("no llama.cpp build installed")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", GOMP, when], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True, env={**env, "OMP_DISPLAY_ENV": "VERBOSE"})
    counts = {line.split("=")[1].strip().strip("'") for line in out.stderr.splitlines() if "GOMP_SPINCOUNT" in line}
    assert counts == {spins}  # one OpenMP runtime serves both (here, by soname), spinning or not
    assert out.stdout.split() == in_time.split()


def test_lent_cores_and_thread_choice() -> None:
    assert [lent_cores(0, p) for p in (1, 2, 8)] == [1, 2, 8]  # automatic: every core (the governor leaves busy ones)
    assert lent_cores(3, 8) == 3
    assert choose_threads(2, 2, 0.0) == 2
    assert choose_threads(2, 2, 0.4) == 2  # a core counts as free while others take less than half of it
    assert choose_threads(2, 2, 0.6) == 1
    assert choose_threads(2, 2, 2.0) == 1  # never fewer than one: idle priority makes it wait, not spin
    assert choose_threads(7, 8, 3.2) == 5
    assert choose_threads(12, 8, 3.0) == 9  # lending more than the physical cores means logical ones
    assert choose_threads(4, 8, -1.0) == 4


def test_the_probe_counts_other_work_only_and_samples_on_its_first_look() -> None:
    clock, system, own, slept = [0.0], [100.0], [10.0], []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s
        system[0] += 1.5 * s  # 1.5 cores busy in all while we sleep ...
        own[0] += 0.5 * s  # ... half a core of it ours

    probe = LoadProbe(clock=lambda: clock[0], system=lambda: system[0], own=lambda: own[0], sleep=sleep)
    assert probe.others_busy() == pytest.approx(1.0) and slept == [machine_load.SAMPLE_S]
    clock[0] += 10.0  # a round later: 10 s, 12 CPU-s in all, 9 of them ours
    system[0] += 12.0
    own[0] += 9.0
    assert probe.others_busy() == pytest.approx(0.3) and len(slept) == 1  # the round itself is the window
    clock[0] += 0.1  # a tiny round: too short a window to count from
    system[0] += 0.2
    assert probe.others_busy() == pytest.approx(0.3) and len(slept) == 1  # the last answer, no sampling
    clock[0] += 0.9  # the window kept growing from the last count: 1 s, 0.2 + 0.8 CPU-s, none ours
    system[0] += 0.8
    assert probe.others_busy() == pytest.approx(1.0)


def test_the_pacer_on_this_machine_chooses_within_the_lent_cores() -> None:
    choice = ThreadPacer().choose(0)
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    assert choice.lent == lent_cores(0, physical) and 1 <= choice.threads <= choice.lent
    assert choice.others_busy >= 0.0 and set(choice.to_dict()) == {"setting", "lent", "physical", "others_busy",
                                                                     "threads"}


def test_a_pause_is_long_enough_to_release_the_model_once() -> None:
    now = [0.0]
    timer = PauseTimer(300.0, clock=lambda: now[0])
    assert not timer.release_due()
    timer.paused()
    now[0] = 299.0
    timer.paused()  # still the same pause
    assert not timer.release_due()
    now[0] = 300.0
    assert timer.release_due()
    timer.freed()
    assert timer.released and not timer.release_due()
    timer.running()
    timer.released = False
    timer.paused()
    assert not timer.release_due()  # a new pause counts from its own start
    assert not PauseTimer(0.0, clock=lambda: now[0]).release_due()
    assert PauseTimer().release_after_s == machine_load.RELEASE_MODEL_AFTER_PAUSE_S
