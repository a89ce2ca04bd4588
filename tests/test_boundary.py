"""The engine never imports Qt: it must run headless, in CI and on servers."""

from __future__ import annotations

import ast
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


def _imported_roots(path: Path) -> set[str]:
    """Every module an `import` anywhere in the file names (in functions too: importing every module,
    as above, cannot see imports that run only when a function is called)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


# The one door: `sapo gui` starts the desktop app, and says so when Qt cannot load.
ALLOWED = {"engine/cli/gui.py": {"app"}}


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("engine", QT_ROOTS | {"app", "lab"}),  # headless, and it ships without the lab
    ("app/models", QT_ROOTS | {"lab"}),  # the views' plain-Python state
    ("app", {"lab"}),  # the GUI ships without the lab too
])
def test_no_import_crosses_a_boundary_even_inside_a_function(folder: str, forbidden: set[str]) -> None:
    crossings = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        name = str(path.relative_to(ROOT))
        crossings[name] = sorted(_imported_roots(path) & forbidden - ALLOWED.get(name, set()))
    assert {name: roots for name, roots in crossings.items() if roots} == {}


def _private_names_used(path: Path) -> list[str]:
    """Names starting with `_` that the file takes from engine/ or app/: imported, or read as an attribute
    of an engine/app module or class it imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    product = {"engine", "app"}
    bound: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in product:
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if alias.name.startswith("_") or any(p.startswith("_") for p in node.module.split(".")):
                    found.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in product:
                    bound.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_lab_uses_only_the_products_public_names() -> None:
    """A bench that reaches into private names measures a copy of the product, not the product."""
    used = {str(p.relative_to(ROOT)): _private_names_used(p) for p in sorted((ROOT / "lab").rglob("*.py"))}
    assert {name: names for name, names in used.items() if names} == {}


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
