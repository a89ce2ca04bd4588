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


def module_name(path: Path) -> str:
    """engine/models/fit.py -> engine.models.fit; a package's __init__.py -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(path: Path) -> list[str]:
    """The project's modules an `import` anywhere in the file loads (relative imports made absolute;
    `from a import b` counts a.b when b is a module, else a); its own parent packages are left out,
    since importing them only runs their __init__."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base)
    ancestors = {".".join(here.split(".")[:i]) for i in range(1, len(here.split(".")) + 1)}
    return sorted(name for name in found if name.split(".")[0] in PRODUCT | {"lab"}
                  and _is_module(name) and name not in ancestors)


def scan(kind: str, folder: str) -> dict[str, list[str]]:
    """`kind` ("roots", "private" or "modules") for every .py file under ROOT/folder, by path relative
    to ROOT."""
    read = {"roots": lambda p: sorted(imported_roots(p)), "private": private_names_used,
            "modules": imported_modules}[kind]
    return {str(p.relative_to(ROOT)): read(p) for p in sorted((ROOT / folder).rglob("*.py"))}

