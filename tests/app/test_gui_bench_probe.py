"""The GUI bench's probes (lab/bench/gui_probe.py) on a real Qt event loop, offscreen: a handler that blocks the
loop is reported as a long stall, and the stack sampler names the function it was in."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QEventLoop, QTimer
from pytestqt.qtbot import QtBot

from lab.bench.gui_probe import StackSampler, StallProbe


def _hog_the_loop_for(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sum(range(1000))


def test_a_blocked_event_loop_is_a_long_stall_that_names_its_function(qtbot: QtBot) -> None:
    sampler = StackSampler(threading.get_ident())
    sampler.start()
    probe = StallProbe(lambda: "test", sampler)
    loop = QEventLoop()
    QTimer.singleShot(200, lambda: _hog_the_loop_for(0.25))
    QTimer.singleShot(800, loop.quit)
    probe.start()
    loop.exec()
    probe.timer.stop()
    sampler.stop()

    summary = probe.summary()
    assert summary["max_stall_ms"] >= 240
    assert summary["stalls_over_50ms"] >= 1
    assert [stall[2] for stall in summary["long_stalls"]] == ["test"] * len(summary["long_stalls"])
    worst = max(range(len(summary["long_stalls"])), key=lambda i: summary["long_stalls"][i][0])
    where = summary["long_stall_stacks"][worst]
    assert where, "the sampler saw nothing during the stall"
    assert "_hog_the_loop_for" in where[0][0]  # the most-seen innermost frames
    assert where[0][1] >= 5  # ~25 samples at 10 ms in 250 ms; few only if the machine is very loaded


def test_without_a_sampler_the_summary_has_no_stacks(qtbot: QtBot) -> None:
    probe = StallProbe()
    loop = QEventLoop()
    QTimer.singleShot(100, loop.quit)
    probe.start()
    loop.exec()
    probe.timer.stop()
    assert "long_stall_stacks" not in probe.summary()
    assert probe.summary()["samples"] > 0
