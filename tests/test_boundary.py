"""The engine never imports Qt: it must run headless, in CI and on servers."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import engine

ROOT = Path(__file__).resolve().parent.parent


def _fresh_python(code: str) -> str:
    """Run `code` in a new interpreter (nothing imported yet) and return what it printed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


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
    qt = _fresh_python(code)
    assert qt == "", f"engine imported Qt modules: {qt}"
    assert len(modules) >= 5


def test_cli_help_is_fast_and_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0
    assert "doctor" in out.stdout


QT_ROOTS = {"PySide6", "PyQt5", "PyQt6", "PySide2", "shiboken6", "pyqtgraph", "qasync"}


def _scan(kind: str, folder: str) -> dict[str, list[str]]:
    """tests/import_scan.py over `folder`, in a fresh interpreter (why: that file's docstring)."""
    return json.loads(_fresh_python(f"import json, sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); "
                                    f"import import_scan; print(json.dumps(import_scan.scan({kind!r}, {folder!r})))"))


# The one door: `sapo gui` starts the desktop app, and says so when Qt cannot load.
ALLOWED = {"engine/cli/gui.py": {"app"}}


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("engine", QT_ROOTS | {"app", "lab"}),  # headless, and it ships without the lab
    ("app/models", QT_ROOTS | {"lab"}),  # the views' plain-Python state
    ("app", {"lab"}),  # the GUI ships without the lab too
])
def test_no_import_crosses_a_boundary_even_inside_a_function(folder: str, forbidden: set[str]) -> None:
    crossings = {name: sorted(set(roots) & forbidden - ALLOWED.get(name, set()))
                 for name, roots in _scan("roots", folder).items()}
    assert {name: roots for name, roots in crossings.items() if roots} == {}


def test_the_lab_uses_only_the_products_public_names() -> None:
    """A bench that reaches into private names measures a copy of the product, not the product."""
    assert {name: names for name, names in _scan("private", "lab").items() if names} == {}


def test_every_error_the_engine_raises_on_purpose_shares_one_root() -> None:
    """One exception tree (engine/errors.py): a caller tells 'refused, with a message' from a bug."""
    code = (
        "import importlib, inspect, pkgutil, engine\n"
        "from engine.errors import SapoError\n"
        "bad = []\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    if m.name.endswith('__main__'):\n"
        "        continue\n"
        "    module = importlib.import_module(m.name)\n"
        "    for name, cls in inspect.getmembers(module, inspect.isclass):\n"
        "        if cls.__module__ == m.name and issubclass(cls, BaseException) and not issubclass(cls, SapoError):\n"
        "            bad.append(m.name + '.' + name)\n"
        "print(','.join(sorted(bad)))\n"
    )
    bad = _fresh_python(code)
    assert bad == "", f"errors outside SapoError: {bad}"
