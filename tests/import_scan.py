"""What a file imports and which private product names it uses, read from its syntax tree.

The boundary tests call `scan` in a fresh interpreter: CPython 3.11's AST constructor keeps one
recursion counter per interpreter, and a parse that failed or ran in another thread earlier in a long
pytest process leaves it off, so a later `ast.parse` raises "AST constructor recursion depth mismatch"
(cpython gh-106905); a new process starts with the counter at zero.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = {"engine", "app"}


def imported_roots(path: Path) -> set[str]:
    """Every module an `import` anywhere in the file names (in functions too: importing every module
    cannot see imports that run only when a function is called)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def private_names_used(path: Path) -> list[str]:
    """Names starting with `_` that the file takes from engine/ or app/: imported, or read as an attribute
    of an engine/app module or class it imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bound: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRODUCT:
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if alias.name.startswith("_") or any(p.startswith("_") for p in node.module.split(".")):
                    found.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PRODUCT:
                    bound.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def scan(kind: str, folder: str) -> dict[str, list[str]]:
    """`kind` ("roots" or "private") for every .py file under ROOT/folder, by path relative to ROOT."""
    read = {"roots": lambda p: sorted(imported_roots(p)), "private": private_names_used}[kind]
    return {str(p.relative_to(ROOT)): read(p) for p in sorted((ROOT / folder).rglob("*.py"))}

