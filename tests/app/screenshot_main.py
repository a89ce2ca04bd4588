"""Run by test_gui_screenshot.py in a child process under Xvfb (Qt's platform is fixed per process):
a live stand-in engine, the real app window joined to it, then a capture of the X screen."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import EngineThread
from PySide6.QtWidgets import QApplication
from standin_node import StandInNode

from app.bridge import EngineBridge
from app.theme import apply_style
from app.views.main_window import MainWindow


def main(out: Path, rounds: int) -> int:
    app = QApplication(sys.argv[:1])
    apply_style(app)
    engine = EngineThread(lambda d: StandInNode(d, round_s=0.01, seed=1), Path(tempfile.mkdtemp()))
    bridge = EngineBridge(engine.url, lambda: engine.token)
    window = MainWindow(bridge, refresh_ms=100, use_tray=False)
    bridge.start()
    window.move(0, 0)
    window.resize(1280, 820)
    window.show()
    deadline = time.monotonic() + 60
    joined = False
    while time.monotonic() < deadline:
        app.processEvents()
        if window.model.node.connected and not joined:
            window.toggle_join()
            joined = True
        if window.model.dashboard.rounds >= rounds:
            break
        time.sleep(0.01)
    engine.loop.call_soon_threadsafe(engine.node.gate.clear)  # hold the round in flight: a still picture
    for _ in range(30):  # let the last batch and the paint land
        app.processEvents()
        time.sleep(0.02)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["import", "-window", "root", str(out)], check=True, timeout=30)
    print(f"rounds={window.model.dashboard.rounds} state={window.model.node.state}")
    window.shutdown()
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), int(sys.argv[2])))
