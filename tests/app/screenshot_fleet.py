"""A real X11 rendering of the Fleet tab with two real engines (this window's own, and a second one
added by URL and token), then of the window after the second one stops training:

    .venv/bin/python tests/app/screenshot_fleet.py bench/screenshots --xvfb

writes fleet.png, fleet_stopped.png (the alert in the status bar and the row) and fleet_remote.png
(the second engine's dashboard, shown in the same window by a double-click on its row). The engines are
real solo nodes on the shipped seed model (`--model tiny`: a random one) behind real control servers
on 127.0.0.1. A private
Xvfb has no system tray, so the desktop notification itself is not in the picture: the same words
go to the tray where there is one (tests/app/test_gui_fleet.py checks them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def run(out_dir: Path, timeout_s: float, model_name: str, rounds: int) -> int:
    from conftest import EngineThread, solo_config
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.theme import apply_style
    from app.views.main_window import MainWindow
    from engine.fleet import FleetEntry
    from engine.models.policy import build_tiny_policy
    from engine.node import Node
    from engine.paths import SEED_MODEL_DIR

    app = QApplication(sys.argv[:1])
    apply_style(app)
    work = Path(tempfile.mkdtemp(prefix="sapo-fleet-shot-"))
    model = build_tiny_policy(work / "tiny") if model_name == "tiny" else SEED_MODEL_DIR
    engines = []
    for seed, name in enumerate(("here", "gaming-pc")):
        data_dir = work / name
        data_dir.mkdir()
        engines.append(EngineThread(lambda d, s=seed: Node(solo_config(d, model, seed=s)), data_dir))
    here, other = engines
    bridge = EngineBridge(here.url, lambda: here.token)
    window = MainWindow(bridge, refresh_ms=100, use_tray=False, fleet_file=work / "fleet.json")
    window.fleet_poller.poll_s = 0.5
    bridge.start()
    window.move(0, 0)
    window.resize(1280, 820)
    window.show()
    window.tabs.setCurrentWidget(window.fleet)
    window.fleet.add(FleetEntry("gaming-pc", other.url, other.token))

    def pump_until(cond, seconds: float) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + seconds
        while not cond() and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.02)

    for engine in engines:  # one at a time: two model loads at once in one process break transformers
        engine.run(engine.node.join())
        pump_until(lambda e=engine: e.status().round >= 1, timeout_s)

    table = window.fleet.table
    pump_until(lambda: table.rowCount() == 2 and all(
        table.item(r, 3) is not None and table.item(r, 3).text().replace(",", "").isdigit()
        and int(table.item(r, 3).text().replace(",", "")) >= rounds for r in range(2))
        and all(table.item(r, 4) is not None and table.item(r, 4).text() not in ("", "–") for r in range(2)),
        timeout_s)
    pump_until(lambda: False, 1.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["import", "-window", "root", str(out_dir / "fleet.png")], check=True, timeout=30)
    other.run(other.node.leave(), timeout=120)  # the gaming PC stops training
    pump_until(lambda: "stopped training" in window.statusBar().currentMessage(), timeout_s)
    pump_until(lambda: False, 1.0)
    subprocess.run(["import", "-window", "root", str(out_dir / "fleet_stopped.png")], check=True, timeout=30)
    window.fleet.open_row(1)  # the double-click: the gaming PC's dashboard, in this window
    pump_until(lambda: window.model.node.connected and window.model.dashboard.rounds >= rounds, timeout_s)
    pump_until(lambda: False, 2.0)  # every plot group drawn (one a refresh)
    subprocess.run(["import", "-window", "root", str(out_dir / "fleet_remote.png")], check=True, timeout=30)
    print(f"rows={table.rowCount()} alert={window.statusBar().currentMessage()!r} "
          f"shown={window.windowTitle()!r} rounds={window.model.dashboard.rounds}")
    window.shutdown()
    for engine in engines:
        engine.close()
    return 0


def main() -> int:
    from screenshot_main import private_display

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder for the three pictures")
    parser.add_argument("--xvfb", action="store_true", help="start a private Xvfb (1280x820) for the window")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each picture")
    parser.add_argument("--model", default="seed", help="seed (default) or tiny (random, fast)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds each engine trains before the first picture")
    args = parser.parse_args()
    with private_display(args.xvfb):
        return run(args.out_dir, args.timeout, args.model, args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
