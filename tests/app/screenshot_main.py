"""A real X11 rendering of the main window against two real nodes linked on 127.0.0.1 (so peers and
shared rollouts exist), captured after some rounds of history.

    .venv/bin/python tests/app/screenshot_main.py bench/screenshots/main_window.png 60 --xvfb

regenerates the committed screenshot on the shipped seed model (`--model PATH` for another model
directory, `--tabs` to capture every tab too). Run in its own process: Qt's platform is fixed per
process, and `--xvfb` starts a private X server for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from lab.display import start_xvfb as lab_xvfb


def start_xvfb(width: int, height: int) -> subprocess.Popen[bytes]:
    """A private X server for this process's Qt windows (lab/display.py)."""
    xvfb, display = lab_xvfb(width, height)
    os.environ["DISPLAY"] = display
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    return xvfb


@contextlib.contextmanager
def private_display(enabled: bool, width: int = 1280, height: int = 820):  # type: ignore[no-untyped-def]
    """A private Xvfb for this process's windows while the block runs (nothing when not `enabled`)."""
    xvfb = start_xvfb(width, height) if enabled else None
    try:
        yield
    finally:
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(10)


def run(out: Path, rounds: int, model: str, tabs: bool, timeout_s: float) -> int:
    from conftest import EngineThread, free_port, linked_config, start_first
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.theme import apply_style
    from app.views.main_window import MainWindow
    from engine.node import Node
    from engine.paths import SEED_MODEL_DIR
    from engine.sapo.config import preset

    app = QApplication(sys.argv[:1])
    apply_style(app)
    work = Path(tempfile.mkdtemp(prefix="sapo-shot-"))
    tiny = model == "tiny"
    if tiny:
        from engine.models.policy import build_tiny_policy

        model = str(build_tiny_policy(work / "tiny"))
    elif model == "seed":
        model = str(SEED_MODEL_DIR)
    # a real model: the laptop preset, 2 own + 2 peers' groups per round, a small held-out eval every
    # 10 rounds; the random tiny one: the tests' fast rounds (conftest.fast_sapo)
    sapo = None if tiny else preset("cpu-small").replace(num_local=2, num_external=2, eval_every=10,
                                                         eval_per_specialty=4, eval_k=4)
    port = free_port()
    peers: list[Node] = []

    async def factory(data_dir: Path) -> Node:
        peer = Node(linked_config(work / "peer", model, seed=1, listen_port=port, sapo=sapo))
        peers.append(peer)
        await start_first(peer)
        return Node(linked_config(data_dir, model, seed=2, peer_urls=(f"ws://127.0.0.1:{port}",), sapo=sapo))

    data_dir = work / "data"
    data_dir.mkdir()
    engine = EngineThread(factory, data_dir, extra_nodes=peers)
    bridge = EngineBridge(engine.url, lambda: engine.token)
    window = MainWindow(bridge, refresh_ms=100, use_tray=False)
    bridge.start()
    window.move(0, 0)
    window.resize(1280, 820)
    window.show()
    deadline = time.monotonic() + timeout_s
    joined = False
    while time.monotonic() < deadline:
        app.processEvents()
        if window.model.node.connected and not joined:
            window.toggle_join()
            joined = True
        if window.model.dashboard.rounds >= rounds and window.model.feed.rows and window.model.node.backend:
            break
        time.sleep(0.01)
    for _ in range(30):  # let the last batch and the paint land; the screen stays still once we stop
        app.processEvents()
        time.sleep(0.02)
    out.parent.mkdir(parents=True, exist_ok=True)
    shots = [(out, window.dashboard)]
    if tabs:
        shots += [(out.with_name(f"{out.stem}_{name}{out.suffix}"), view) for name, view in (
            ("rollouts", window.rollouts), ("peers", window.peers), ("machine", window.machine),
            ("settings", window.settings), ("log", window.log_view))]
    for path, view in shots:
        window.tabs.setCurrentWidget(view)
        for _ in range(10):
            app.processEvents()
            time.sleep(0.02)
        subprocess.run(["import", "-window", "root", str(path)], check=True, timeout=30)
        window.tabs.setCurrentWidget(window.dashboard)
    print(f"rounds={window.model.dashboard.rounds} state={window.model.node.state} "
          f"rollouts={len(window.model.feed.rows)} peers={window.model.peers.connected} model={model}")
    window.shutdown()
    engine.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("rounds", type=int, help="rounds of history before the capture")
    parser.add_argument("--model", default="seed", help="seed (default), tiny (random, fast) or a model directory")
    parser.add_argument("--xvfb", action="store_true", help="start a private Xvfb (1280x820) for the window")
    parser.add_argument("--tabs", action="store_true", help="also capture each tab, next to OUT")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the rounds")
    args = parser.parse_args()
    with private_display(args.xvfb):
        return run(args.out, args.rounds, args.model, args.tabs, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
