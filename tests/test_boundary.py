"""The engine never imports Qt: it must run headless, in CI and on servers."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import engine


def test_importing_all_of_engine_loads_no_qt() -> None:
    modules = [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")
               if not m.name.endswith("__main__")]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "qt = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('PySide6', 'PyQt5', 'PyQt6', 'PySide2', 'shiboken6', 'pyqtgraph', 'qasync'))\n"
        "print(','.join(qt))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"engine imported Qt modules: {out.stdout.strip()}"
    assert len(modules) >= 5


def test_cli_help_is_fast_and_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0
    assert "doctor" in out.stdout
