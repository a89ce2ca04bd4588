"""`sapo gui`: find or start the engine, connect, show the window.

The engine is another process (`sapo run --headless --control`); this process only draws. Waiting
for a starting engine runs a local event loop with a progress dialog, never a blocking sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QProgressDialog

from app.bridge import EngineBridge
from app.theme import app_icon, apply_style
from app.views.main_window import MainWindow
from engine.control.launcher import EngineStartError, find_engine, poll_engine, start_engine
from engine.control.token import ControlInfo, TokenError, read_control_info, read_token, validate_token

START_TIMEOUT_S = 180.0  # loading a model on a slow laptop can take a while


def make_app() -> QApplication:
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(sys.argv[:1])
    app.setApplicationName("SAPO Swarm")
    app.setDesktopFileName("sapo-swarm")
    app.setWindowIcon(app_icon())
    apply_style(app)
    return app


def wait_for_start(data_dir: Path, proc: subprocess.Popen[bytes]) -> ControlInfo | str:
    """Progress dialog while the engine starts: its address, or an error message."""
    dialog = QProgressDialog("Starting the SAPO engine…", "Cancel", 0, 0)
    dialog.setWindowTitle("SAPO Swarm")
    dialog.setMinimumDuration(0)
    outcome: list[ControlInfo | str] = []
    elapsed = [0.0]

    def poll() -> None:
        elapsed[0] += 0.2
        try:
            info = poll_engine(data_dir, proc)
        except EngineStartError as exc:
            outcome.append(str(exc))
            dialog.reset()
            return
        if info is not None:
            outcome.append(info)
            dialog.reset()
        elif elapsed[0] > START_TIMEOUT_S:
            outcome.append(f"the engine did not answer within {START_TIMEOUT_S:g} s")
            dialog.reset()
        else:
            dialog.setLabelText(f"Starting the SAPO engine… ({elapsed[0]:.0f} s)")

    timer = QTimer()
    timer.timeout.connect(poll)
    timer.start(200)
    dialog.exec()
    timer.stop()
    return outcome[0] if outcome else "cancelled"


def run_gui(data_dir: Path, engine_url: str | None = None, token: str | None = None,
            start: bool = True, engine_args: tuple[str, ...] = ()) -> int:
    """Returns the process exit code."""
    app = make_app()
    stop_engine: Callable[[], None] | None = None
    url_provider: Callable[[], str | None] | None = None
    if engine_url is not None:  # a headless node elsewhere (e.g. through an SSH tunnel)
        if token is None:
            print("sapo gui --engine needs the engine's token: --token-file PATH or SAPO_CONTROL_TOKEN",
                  file=sys.stderr)
            return 2
        fixed = validate_token(token)

        def token_provider() -> str:
            return fixed
        url = engine_url
    else:
        info = find_engine(data_dir)
        if info is None:
            if not start:
                print(f"no engine is serving {data_dir} (start one with `sapo run --control`)", file=sys.stderr)
                return 1
            proc = start_engine(data_dir, engine_args)
            waited = wait_for_start(data_dir, proc)
            if isinstance(waited, str):
                if proc.poll() is None:
                    proc.terminate()
                QMessageBox.critical(None, "SAPO Swarm", f"The engine could not start:\n\n{waited}")
                return 1
            info = waited
            stop_engine = proc.terminate

        def token_provider() -> str:
            return read_token(data_dir)  # renewed by each engine start

        def current_url() -> str | None:
            found = read_control_info(data_dir)
            return found.url if found else None
        url, url_provider = info.url, current_url
    bridge = EngineBridge(url, token_provider, url_provider=url_provider)
    window = MainWindow(bridge, stop_engine=stop_engine)
    app.setQuitOnLastWindowClosed(window.tray is None)
    bridge.start()
    window.show()
    try:
        return app.exec()
    finally:
        window.shutdown()


def token_from(token_file: Path | None) -> str | None:
    """The token for `--engine`: a file (preferred: not visible in `ps`) or SAPO_CONTROL_TOKEN."""
    if token_file is not None:
        try:
            return validate_token(token_file.read_text(encoding="utf-8")[:1024])
        except (OSError, TokenError) as exc:
            raise SystemExit(f"cannot read a control token from {token_file}: {exc}") from None
    return os.environ.get("SAPO_CONTROL_TOKEN") or None
