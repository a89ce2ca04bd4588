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


# The engine's floors, top to bottom: a room imports only from floors below its own (function bodies
# included). Machine sits under models: the models' thread pacing reads the machine's load.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(floor.split()) for floor in (
    "__main__",
    "cli",
    "node export",
    "swarm supervisor fleet doctor autostart",
    "round_probe",
    "sapo",
    "control evaluation",
    "models",
    "machine",
    "tasks store checkpoint bus",
    "events metrics paths settings",
    "errors",
))


def _room(module: str) -> str:
    """engine.models.fit -> models; engine.paths -> paths; engine -> "" (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor(room: str) -> int:
    return next(i for i, floor in enumerate(LAYERS) if room in floor)


def _engine_graph() -> dict[str, list[str]]:
    """engine module -> the engine modules it imports."""
    edges = {}
    for path, imported in _scan("modules", "engine").items():
        module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        edges[module] = [name for name in imported if name.split(".")[0] == "engine"]
    return edges


def test_every_engine_room_sits_on_a_floor() -> None:
    rooms = {_room(module) for module in _engine_graph()} - {""}
    placed = set().union(*LAYERS)
    assert rooms - placed == set(), "a new room: put it on a floor in LAYERS"
    assert placed - rooms == set(), "a floor names a room that no longer exists"


def test_engine_imports_point_down_the_floors_only() -> None:
    upward = sorted(f"{module} -> {name}" for module, imported in _engine_graph().items() if _room(module)
                    for name in imported if _room(name) and _room(name) != _room(module)
                    and _floor(_room(name)) <= _floor(_room(module)))
    assert upward == []


def _cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges.get(start, [])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_sees_a_hand_built_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


def test_no_engine_module_imports_itself_round_a_cycle() -> None:
    assert _cycles(_engine_graph()) == []


def test_app_reaches_the_engine_through_its_public_rooms_only() -> None:
    """The GUI is a client of the engine: it never drives the CLI (sapo gui is the one door, the other
    way round)."""
    crossings = {path: [name for name in imported if _room(name) in ("cli", "__main__")]
                 for path, imported in _scan("modules", "app").items()}
    assert {path: names for path, names in crossings.items() if names} == {}
