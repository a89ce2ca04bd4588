"""A real X11 rendering (Xvfb) of the main window against two real linked nodes on a tiny model.

The committed bench/screenshots/main_window.png comes from the same script on the seed model:
`.venv/bin/python tests/app/screenshot_main.py bench/screenshots/main_window.png 60 --xvfb`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

HERE = Path(__file__).parent


@pytest.mark.slow  # a child process: Qt under Xvfb, torch, two real nodes (~15 s on 2 shared cores)
@pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("import") is None,
                    reason="needs Xvfb and imagemagick: apt-get install -y xvfb libxcb-cursor0 "
                           "libxcb-icccm4 libxcb-keysyms1 imagemagick")
def test_main_window_screenshot_under_xvfb(tmp_path: Path) -> None:
    shot = tmp_path / "main_window.png"
    run = subprocess.run([sys.executable, str(HERE / "screenshot_main.py"), str(shot), "8", "--model", "tiny",
                          "--xvfb", "--timeout", "90"], capture_output=True, text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "state=in_swarm" in run.stdout and "peers=1" in run.stdout, run.stdout
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
