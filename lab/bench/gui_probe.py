"""The GUI half of `sapo bench gui` (Qt lives in app/ only): the real app window attached to a real
engine process that trains flat out, and a probe timer measuring how late the Qt event loop runs.

Run as `python -m lab.bench.gui_probe ENGINE_DATA_DIR SECONDS` by lab/bench/gui.py; prints one JSON line.
The probe asks to fire every 5 ms; a stall is how much later than that it fired. The window cycles
through its tabs meanwhile, so every view's refresh is in the measurement.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from PySide6.QtCore import QElapsedTimer, QEventLoop, Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.bridge import EngineBridge
from app.main import make_app
from app.views.main_window import MainWindow
from engine.control.token import read_control_info, read_token

PROBE_MS = 5
STACKS_ENV = "SAPO_BENCH_STACKS"  # set: sample the Qt thread's Python stack, to say where long stalls were
SAMPLE_S = 0.01


class StackSampler:
    """A thread that samples the Qt thread's Python stack every 10 ms, so a long stall can say where it was.

    While Qt works in C++ (layout, paint) the innermost Python frame is the one that entered Qt: the
    event loop itself for a paint the loop scheduled, or the Python line that asked for the work. Off by
    default: taking the GIL 100 times a second nudges the timings it explains."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.samples: collections.deque[tuple[int, tuple[str, ...]]] = collections.deque(maxlen=20_000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            frame = sys._current_frames().get(self.thread_id)
            stack: list[str] = []
            while frame is not None and len(stack) < 8:
                code = frame.f_code
                stack.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
                frame = frame.f_back
            self.samples.append((time.monotonic_ns(), tuple(stack)))

    def where(self, start_ns: int, end_ns: int, top: int = 3) -> list[tuple[str, int]]:
        """The innermost frames seen most in [start, end] (monotonic ns), with their sample counts."""
        counts = collections.Counter(" < ".join(stack[:3]) for t, stack in list(self.samples)
                                     if start_ns <= t <= end_ns)
        return counts.most_common(top)


class StallProbe:
    def __init__(self, context: Callable[[], str] = lambda: "", sampler: StackSampler | None = None) -> None:
        self.clock = QElapsedTimer()
        self.sampler = sampler
        self.stall_stacks: list[list[tuple[str, int]]] = []  # with a sampler: where each long stall was
        self._last_mono = 0
        self.gaps_ms: list[float] = []
        self.context = context  # what the app was showing, noted for each long stall
        self.long_stalls: list[tuple[float, float, str]] = []  # (wall ms, Qt-thread CPU ms, tab)
        self.busy_ms: list[float] = []  # CPU the Qt thread itself used between probe firings
        self._last_cpu = 0
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(PROBE_MS)
        self.timer.timeout.connect(self._fire)
        self._last: int | None = None

    def start(self) -> None:
        self.clock.start()
        self._last = None
        self.timer.start()

    def _fire(self) -> None:
        now, cpu, mono = self.clock.nsecsElapsed(), time.thread_time_ns(), time.monotonic_ns()
        if self._last is not None:
            gap, busy = (now - self._last) / 1e6, (cpu - self._last_cpu) / 1e6
            self.gaps_ms.append(gap)
            self.busy_ms.append(busy)
            if gap - PROBE_MS > 50:  # wall time beyond busy time is time spent waiting for a core
                self.long_stalls.append((round(gap - PROBE_MS, 1), round(busy, 1), self.context()))
                if self.sampler is not None:
                    self.stall_stacks.append(self.sampler.where(self._last_mono, mono))
        self._last, self._last_cpu, self._last_mono = now, cpu, mono

    def summary(self) -> dict[str, Any]:
        stalls = sorted(max(0.0, gap - PROBE_MS) for gap in self.gaps_ms)
        if not stalls:
            return {"samples": 0}
        return {"samples": len(stalls), "max_stall_ms": stalls[-1],
                "p99_stall_ms": stalls[min(len(stalls) - 1, int(0.99 * len(stalls)))],
                "p50_stall_ms": statistics.median(stalls),
                "stalls_over_50ms": sum(s > 50 for s in stalls), "stalls_over_16ms": sum(s > 16 for s in stalls),
                "max_busy_ms": max(self.busy_ms), "long_stalls": self.long_stalls[:50],
                **({"long_stall_stacks": self.stall_stacks[:50]} if self.sampler is not None else {})}


class GcTimer:
    """Times the garbage collector's pauses (they run on whichever thread allocates: often Qt's)."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._start) * 1000)

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def _run_phase(window: MainWindow, seconds: float, switch_tabs: bool,
               sampler: StackSampler | None = None) -> dict[str, Any]:
    window.tabs.setCurrentWidget(window.dashboard)
    probe = StallProbe(lambda: f"{window.tabs.tabText(window.tabs.currentIndex())} at "
                               f"{probe.clock.elapsed() / 1000:.2f} s", sampler)
    switcher = QTimer()
    switcher.timeout.connect(lambda: window.tabs.setCurrentIndex((window.tabs.currentIndex() + 1)
                                                                 % window.tabs.count()))
    if switch_tabs:
        switcher.start(1500)
    probe.start()
    # A loop of its own: QApplication.quit would also close the window (Qt 6), which shuts the app's
    # links down, and the phases after it would watch a window that no longer ticks.
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    probe.timer.stop()
    switcher.stop()
    return probe.summary()


def measure(data_dir: Path, seconds: float) -> dict[str, Any]:
    app: QApplication = make_app()
    info = read_control_info(data_dir)
    if info is None:
        raise SystemExit(f"no engine serving {data_dir}")
    engine = psutil.Process(info.pid)
    bridge = EngineBridge(info.url, lambda: read_token(data_dir))
    window = MainWindow(bridge, use_tray=False)
    tick_ms: list[float] = []
    plain_tick = window.tick

    def timed_tick() -> None:
        started = time.perf_counter()
        plain_tick()
        tick_ms.append((time.perf_counter() - started) * 1000)
    window.timer.timeout.disconnect()
    window.timer.timeout.connect(timed_tick)
    bridge.start()
    window.show()
    deadline = time.monotonic() + 120
    while not window.model.node.connected and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    if not window.model.node.connected:
        raise SystemExit("the app could not connect to the engine")
    window.toggle_join()
    deadline = time.monotonic() + 900  # a real model loads first (GGUF conversion on a fresh data dir)
    while window.model.node.state not in ("solo", "in_swarm") and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    rounds_before = window.model.node.round
    engine.cpu_percent()
    gui = psutil.Process()
    gui.cpu_percent()
    gc_timer = GcTimer()
    sampler = StackSampler(threading.get_ident()) if os.environ.get(STACKS_ENV) else None
    if sampler is not None:
        sampler.start()
    # Phase 1: a contributor watching the dashboard. Phase 2: clicking through every tab.
    watching = _run_phase(window, seconds / 2, switch_tabs=False, sampler=sampler)
    switching = _run_phase(window, seconds / 2, switch_tabs=True, sampler=sampler)
    if sampler is not None:
        sampler.stop()
    gc_timer.close()
    if not window.timer.isActive():
        raise SystemExit("the window stopped ticking during the measurement")
    result = {"seconds": seconds, "watching": watching, "switching_tabs": switching,
              "ticks": len(tick_ms), "tick_max_ms": max(tick_ms, default=0.0),
              "tick_mean_ms": statistics.fmean(tick_ms) if tick_ms else 0.0,
              "rounds_during": window.model.node.round - rounds_before,
              "engine_cpu_percent": engine.cpu_percent(), "gui_cpu_percent": gui.cpu_percent(),
              "engine_nice": engine.nice(), "gc_max_pause_ms": max(gc_timer.pauses_ms, default=0.0),
              "cpu_count": psutil.cpu_count(), "engine_state": window.model.node.state,
              "model": window.model.node.model}
    window.shutdown(keep_engine=True)  # the bench stops the engine itself
    return result


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1]), float(sys.argv[2]))))
