"""A real X11 rendering of the main window (Xvfb), saved to bench/screenshots/main_window.png."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

from engine.paths import BENCH_DIR

HERE = Path(__file__).parent
OUT = BENCH_DIR / "screenshots" / "main_window.png"


@pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("import") is None,
                    reason="needs Xvfb and imagemagick: apt-get install -y xvfb libxcb-cursor0 "
                           "libxcb-icccm4 libxcb-keysyms1 imagemagick")
def test_main_window_screenshot_under_xvfb(tmp_path: Path) -> None:
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "1280x820x24", "-nolisten", "tcp"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert xvfb.stdout is not None
        display = xvfb.stdout.readline().decode().strip()
        assert display.isdigit(), "Xvfb did not report a display"
        env = {**os.environ, "DISPLAY": f":{display}", "QT_QPA_PLATFORM": "xcb"}
        shot = tmp_path / "main_window.png"
        run = subprocess.run([sys.executable, str(HERE / "screenshot_main.py"), str(shot), "240"], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "state=in_swarm" in run.stdout
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    image = QImage(str(shot))
    assert (image.width(), image.height()) == (1280, 820)
    # The big button is the "Leave" red and the state text the "in swarm" green: count their pixels.
    counts = {"#b91c1c": 0, "#16a34a": 0, "#ffffff": 0}
    for y in range(0, 820, 2):
        for x in range(0, 1280, 2):
            name = QColor(image.pixel(x, y)).name()
            if name in counts:
                counts[name] += 1
    assert counts["#b91c1c"] > 1000, counts  # the Leave button
    assert counts["#16a34a"] > 20, counts  # the state dot and label
    assert counts["#ffffff"] > 50_000, counts  # panels, not a black screen
    OUT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, OUT)
