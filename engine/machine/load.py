"""What the engine takes from a machine that is also in use: its CPU priority, its thread count, its waits.

A contributor's machine is never idle for long, and measured on a shared 2-core machine
(docs/ENVIRONMENT facts, issue 32) the engine fell far below a fair share there: llama.cpp's and
torch's OpenMP workers spin at every barrier, so one preempted worker stalls the rest while they burn
the core the owner wanted. Three levers, each chosen here and applied by the engine process:

  * wait policy: OMP_WAIT_POLICY=PASSIVE makes a waiting OpenMP worker sleep instead of spinning. The
    OpenMP runtime reads it once, when it loads, so it is set before torch or llama.cpp are imported
    (`sapo run` and the launcher do). llama-cpp-python built with OpenMP (its system info says
    "OPENMP = 1", as the default and the bundle's portable builds do on Linux) waits through libgomp's
    barrier, so this applies to it; a build without OpenMP spins in ggml's own barrier whatever its
    threadpool's `poll` says (poll only governs waiting for the next graph), so there the thread count
    below is the lever.
  * priority: idle priority where the OS has one (Linux SCHED_IDLE, Windows IDLE_PRIORITY_CLASS, macOS
    background), so the owner's work always runs first; nice 19 where that is refused.
  * threads: the cores the contributor lends (automatic: all of them), less those other work keeps busy
    now (`ThreadPacer`), chosen again inside a round at every decode step and update chunk
    (engine/machine/governor.py): a thread that has to share its core stalls its siblings, so the
    count follows the owner's load within a step of it coming or going.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from engine.machine.hardware import cpu_info
from engine.machine.memory import trim_heap

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
PRIORITY_ENV = "SAPO_PRIORITY"  # the launcher tells the engine child its priority through this
PRIORITIES = ("idle", "low", "normal")
LOW_NICE = 19  # the fallback where idle priority is refused, and the "low" level
SAMPLE_S = 0.5  # a first look at the machine's load samples this long
MIN_WINDOW_S = 0.25  # shorter windows than this are too noisy to count busy cores from
# A model left loaded through a long pause holds its memory (hundreds of MB for SmolLM2) for nothing;
# reloading costs seconds. After this long paused the node releases it and loads it again on resume.
RELEASE_MODEL_AFTER_PAUSE_S = 5 * 60.0

# Windows (winbase.h)
IDLE_PRIORITY_CLASS = 0x40
BELOW_NORMAL_PRIORITY_CLASS = 0x4000
PROCESS_SET_INFORMATION = 0x0200
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
# macOS (sys/resource.h)
PRIO_DARWIN_PROCESS = 4
PRIO_DARWIN_BG = 0x1000


# ---- wait policy --------------------------------------------------------------------------------------

def passive_wait_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a child whose OpenMP workers sleep while they wait (a value already there is kept:
    whoever set it meant it)."""
    return {**env, WAIT_POLICY_ENV: env.get(WAIT_POLICY_ENV) or "PASSIVE"}


def set_passive_wait() -> bool:
    """Ask this process's OpenMP runtimes to wait passively -> whether it can still take effect (False
    when torch or llama.cpp is already loaded: their runtime read the variable at load)."""
    os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")
    return not any(name in sys.modules for name in ("torch", "llama_cpp", "engine.models.llama_lib"))


# ---- priority -----------------------------------------------------------------------------------------

def default_priority(env: Mapping[str, str] | None = None) -> str:
    """The level an engine runs at unless told: the launcher's (SAPO_PRIORITY), else idle."""
    level = (os.environ if env is None else env).get(PRIORITY_ENV, "idle")
    return level if level in PRIORITIES else "idle"


def apply_priority(level: str, pid: int = 0, platform: str | None = None) -> str:
    """Lower the CPU priority of process `pid` (0: this one) to `level` -> what was applied, in words.
    Never raises for a refusal: priority is a courtesy, and the engine also runs without it."""
    if level not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {level!r}")
    if level == "normal":
        return "normal"
    platform = platform or sys.platform
    if platform.startswith("linux"):
        return _linux(level, pid)
    if platform == "win32":
        return _windows(level, pid)
    if platform == "darwin":
        return _darwin(level, pid)
    return _nice_process(pid, "")


def _threads_of(pid: int) -> list[int]:
    """Linux: every thread of the process (a thread's policy and nice value are its own; new threads
    inherit their creator's, so lowering every existing one covers those still to come)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid or os.getpid()}/task"))
    except OSError:
        return [pid or os.getpid()]


def _linux(level: str, pid: int) -> str:
    tids = _threads_of(pid)
    refused = ""
    if level == "idle":
        try:
            for tid in tids:
                _skip_gone(os.sched_setscheduler, tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:  # e.g. a seccomp policy or an old kernel: nice 19 is the next best
            refused = f" (SCHED_IDLE refused: {exc.strerror or exc})"
        else:
            _io_idle(tids)
            return f"SCHED_IDLE on {len(tids)} thread(s)"
    for tid in tids:
        try:
            _skip_gone(os.setpriority, os.PRIO_PROCESS, tid, LOW_NICE)
        except OSError as exc:
            return f"normal (nice {LOW_NICE} refused: {exc.strerror or exc})"
    return f"nice {LOW_NICE} on {len(tids)} thread(s){refused}"


def _skip_gone(call: Callable[..., Any], tid: int, *args: Any) -> None:
    try:
        call(tid, *args)
    except ProcessLookupError:
        pass  # the thread ended between listing and lowering it


def _io_idle(tids: list[int]) -> None:
    """Linux: the idle I/O class too, so a checkpoint write never queues before the owner's reads."""
    for tid in tids:
        try:
            psutil.Process(tid).ionice(psutil.IOPRIO_CLASS_IDLE)
        except (psutil.Error, OSError, AttributeError):
            return  # a courtesy, like the rest


def _kernel32() -> Any:
    from ctypes import wintypes  # Windows only

    k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    k32.GetCurrentProcess.restype = k32.OpenProcess.restype = wintypes.HANDLE  # a pointer: not an int
    k32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    k32.SetPriorityClass.argtypes = [wintypes.HANDLE, wintypes.DWORD]
    k32.SetPriorityClass.restype = wintypes.BOOL
    k32.CloseHandle.argtypes = [wintypes.HANDLE]
    return k32


def _last_error() -> int:
    return int(getattr(ctypes, "get_last_error", lambda: 0)())  # Windows' GetLastError, kept by ctypes


def _windows(level: str, pid: int) -> str:
    # IDLE_PRIORITY_CLASS as BOINC does, not PROCESS_MODE_BACKGROUND_BEGIN: background mode also lowers
    # memory priority, and a trimmed working set would page the model in and out every round.
    cls, name = ((IDLE_PRIORITY_CLASS, "IDLE_PRIORITY_CLASS") if level == "idle"
                 else (BELOW_NORMAL_PRIORITY_CLASS, "BELOW_NORMAL_PRIORITY_CLASS"))
    k32 = _kernel32()
    handle = k32.GetCurrentProcess() if pid == 0 else k32.OpenProcess(
        PROCESS_SET_INFORMATION | PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return f"normal (OpenProcess failed: error {_last_error()})"
    try:
        if not k32.SetPriorityClass(handle, cls):
            return f"normal (SetPriorityClass refused: error {_last_error()})"
    finally:
        if pid != 0:
            k32.CloseHandle(handle)
    return name


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _darwin(level: str, pid: int) -> str:
    # Background: the lowest CPU and I/O priority; on Apple silicon it also keeps the engine on the
    # efficiency cores, the price of never being felt (the contributor can choose "low" instead).
    if level == "idle":
        if _libc().setpriority(PRIO_DARWIN_PROCESS, pid, PRIO_DARWIN_BG) == 0:
            return "PRIO_DARWIN_BG"
        return _nice_process(pid, f" (background refused: {os.strerror(ctypes.get_errno())})")
    return _nice_process(pid, "")


def _nice_process(pid: int, why: str) -> str:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, LOW_NICE)
    except OSError as exc:
        return f"normal (nice {LOW_NICE} refused: {exc.strerror or exc})"
    return f"nice {LOW_NICE}{why}"


def current_priority(pid: int = 0) -> str:
    """What this process (its main thread on Linux) runs at now, in words."""
    if sys.platform.startswith("linux") and os.sched_getscheduler(pid) == os.SCHED_IDLE:
        return "SCHED_IDLE"
    try:
        return f"nice {psutil.Process(pid or os.getpid()).nice()}"
    except (psutil.Error, OSError):
        return "unknown"


# ---- threads ------------------------------------------------------------------------------------------

def lent_cores(setting: int, physical: int) -> int:
    """The cores the contributor lends: the setting, or 0 = automatic, every physical core (the
    governor leaves the ones the owner's work takes; keeping one back for good cost an idle 2-core
    machine 1.72x its round time)."""
    return setting if setting > 0 else max(1, physical)


def choose_threads(lent: int, physical: int, others_busy: float) -> int:
    """Threads for the next round: the lent cores that other work leaves free (a core counts as free
    while others take less than half of it), never fewer than one. Lending more cores than the
    physical ones means logical ones: those count as the machine's capacity then."""
    capacity = max(physical, lent)
    free = capacity - min(max(others_busy, 0.0), capacity)
    return max(1, min(lent, math.floor(free + 0.5)))


def _system_busy() -> float:
    """CPU-seconds every logical CPU has spent not idle (guest time is already inside user time)."""
    t = psutil.cpu_times()
    spare = {"idle", "iowait", "guest", "guest_nice"}
    return sum(getattr(t, name) for name in t._fields if name not in spare)


def _own_busy() -> float:
    """CPU-seconds of this process and its finished children (e.g. a GGUF conversion it waited for)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class LoadProbe:
    """How many cores other work kept busy since the last look (this process excluded), in logical CPUs:
    the scheduler spreads busy threads over physical cores first, so each takes one from the engine."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, system: Callable[[], float] = _system_busy,
                 own: Callable[[], float] = _own_busy, sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock, self._system, self._own, self._sleep = clock, system, own, sleep
        self._last: tuple[float, float, float] | None = None
        self._busy = 0.0

    def _snapshot(self) -> tuple[float, float, float]:
        return self._clock(), self._system(), self._own()

    def others_busy(self) -> float:
        if self._last is None:  # the first look: nothing to compare with yet, so sample
            self._last = self._snapshot()
            self._sleep(SAMPLE_S)
        elif self._clock() - self._last[0] < MIN_WINDOW_S:
            return self._busy  # too short to count from (tiny rounds): the last answer stands, the window grows
        then, now = self._last, self._snapshot()
        self._last = now
        wall = max(now[0] - then[0], 1e-9)
        self._busy = max(0.0, ((now[1] - then[1]) - (now[2] - then[2])) / wall)
        return self._busy


@dataclass(frozen=True)
class ThreadChoice:
    setting: int  # the contributor's cpu_cores (0 = automatic)
    lent: int  # cores lent
    physical: int  # physical cores of the machine
    others_busy: float  # cores other work kept busy over the last window
    threads: int  # threads the next round runs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ThreadPacer:
    """Chooses each round's threads from the lent cores and the load measured since the last round."""

    def __init__(self, probe: LoadProbe | None = None, physical: int | None = None) -> None:
        self.probe = probe or LoadProbe()
        self.physical = physical or psutil.cpu_count(logical=False) or os.cpu_count() or 1

    def choose(self, setting: int) -> ThreadChoice:
        lent = lent_cores(setting, self.physical)
        busy = min(self.probe.others_busy(), float(max(self.physical, lent)))
        return ThreadChoice(setting, lent, self.physical, round(busy, 2),
                            choose_threads(lent, self.physical, busy))


def set_train_threads(device: str, cores: int) -> None:
    """Threads while the model loads: the cores the contributor lends (0 = all physical cores). The
    node's governor re-chooses them from what is free (engine/machine/governor.py)."""
    if device == "cpu":
        apply_threads(device, lent_cores(cores, cpu_info().physical_cores))


def apply_threads(device: str, threads: int, generator: Any = None) -> None:
    """Run the next round on `threads` threads: torch's intra-op pool and, where the generator has its
    own (llama.cpp), the generator's. Only CPUs: a GPU round's speed does not follow the CPU threads."""
    if device != "cpu":
        return
    import torch

    threads = max(1, int(threads))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    set_generator_threads = getattr(generator, "set_threads", None)
    if set_generator_threads is not None:
        set_generator_threads(threads)


class PauseTimer:
    """How long the node has waited (paused, snoozed, on battery, ...), and whether that is long enough
    to release the model. `release_after_s` None: RELEASE_MODEL_AFTER_PAUSE_S; 0: never."""

    def __init__(self, release_after_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.release_after_s = RELEASE_MODEL_AFTER_PAUSE_S if release_after_s is None else release_after_s
        self._clock = clock
        self._since: float | None = None
        self.released = False  # the model was released and has not been loaded again yet

    def paused(self) -> None:
        if self._since is None:
            self._since = self._clock()

    def running(self) -> None:
        self._since = None

    def release_due(self) -> bool:
        return (bool(self.release_after_s) and not self.released and self._since is not None
                and self._clock() - self._since >= self.release_after_s)

    def freed(self) -> None:
        """The caller dropped the model: collect what it held (torch modules keep reference cycles) and
        hand the freed pages back to the system."""
        self.released = True
        gc.collect()
        trim_heap()
