"""The bundle's entry point: one executable that is both the app and the `sapo` command line.

    sapo                  -> `sapo start` (the app where a display exists, else a headless node)
    sapo doctor --json    -> the command line, exactly as `sapo` from a venv
    sapo -m engine ARGS   -> ARGS: code that starts itself as `sys.executable -m engine ...` (the GUI's
                             engine launcher, benches) works unchanged inside the bundle
"""

from __future__ import annotations

import multiprocessing
import sys

# `python -m X` spellings that mean "the sapo command line" inside the bundle.
SELF_MODULES = ("engine", "engine.cli")


def bundle_argv(argv: list[str]) -> list[str]:
    """The `sapo` arguments for the bundle's own argv[1:] (see the module docstring)."""
    if not argv:
        return ["start"]
    if argv[0] == "-m":
        if len(argv) < 2 or argv[1] not in SELF_MODULES:
            raise SystemExit(f"this bundle can only run `-m engine`, not {' '.join(argv[:2])!r}")
        return argv[2:] or ["--help"]
    return argv


def main() -> int:
    multiprocessing.freeze_support()  # a frozen child started by multiprocessing must not rerun main
    from engine.cli import main as sapo_main

    return sapo_main(bundle_argv(sys.argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
