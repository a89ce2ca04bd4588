"""The idle-time probe under a real X server (Xvfb), from several threads at once, as two node workers
(and the GUI) in one process do: it once corrupted the heap (Xlib is not thread-safe)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

PROBE = """
import threading
from engine.machine import hardware
first = hardware.idle_seconds()
assert first is not None and first >= 0, first
def probe():
    for _ in range(40):
        assert hardware.idle_seconds() is not None
threads = [threading.Thread(target=probe) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("probes ok")
"""


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb")
def test_idle_probe_from_many_threads_under_x11() -> None:
    from ctypes.util import find_library

    if not find_library("X11") or not find_library("Xss"):
        pytest.skip("needs libX11 and libXss")
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "320x240x24", "-nolisten", "tcp"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert xvfb.stdout is not None
        display = xvfb.stdout.readline().decode().strip()
        env = {**os.environ, "DISPLAY": f":{display}"}
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert run.returncode == 0 and "probes ok" in run.stdout, run.stderr[-2000:]
