"""`sapo install-desktop` / `sapo uninstall-desktop` / `sapo autostart`: menu entry, icons, start at login.

Per user, no root: the menu entry goes to `$XDG_DATA_HOME/applications`, the icons to the hicolor
theme under `$XDG_DATA_HOME/icons`. The entry runs this very executable (the bundle's `sapo`, or this
venv), so run it again after moving the bundle.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine import autostart
from engine.autostart import APP_ID

PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def icon_files(resources_dir: Path | None = None, repo_root: Path | None = None) -> dict[str, Path]:
    """hicolor size dir ("48x48", "scalable") -> source file. The bundle carries the PNGs in its
    resources/icons; a source checkout has them in packaging/icons."""
    from engine.paths import REPO_ROOT, RESOURCES_DIR

    res = (resources_dir or RESOURCES_DIR) / "icons"
    dirs = [res, (repo_root or REPO_ROOT) / "packaging" / "icons"]
    found: dict[str, Path] = {}
    for size in PNG_SIZES:
        for folder in dirs:
            path = folder / f"{APP_ID}-{size}.png"
            if path.is_file():
                found[f"{size}x{size}"] = path
                break
    svg = res / "sapo.svg"
    if svg.is_file():
        found["scalable"] = svg
    return found


def desktop_paths(data_home: Path, icons: dict[str, Path]) -> dict[str, Path]:
    """Every file install writes: "entry" and one per icon size."""
    paths = {"entry": data_home / "applications" / f"{APP_ID}.desktop"}
    for size, src in icons.items():
        paths[size] = data_home / "icons" / "hicolor" / size / "apps" / f"{APP_ID}{src.suffix}"
    return paths


def install(data_home: Path, command: list[str], icons: dict[str, Path]) -> list[Path]:
    """Write the menu entry and the icons; returns the files written."""
    paths = desktop_paths(data_home, icons)
    written: list[Path] = []
    for size, src in icons.items():
        paths[size].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, paths[size])
        written.append(paths[size])
    autostart.write_text_atomic(paths["entry"], autostart.desktop_entry(command))
    written.append(paths["entry"])
    return written


def uninstall(data_home: Path) -> list[Path]:
    """Remove the entry and every icon size install may have written; returns what was removed."""
    candidates = [data_home / "applications" / f"{APP_ID}.desktop"]
    for size in [f"{s}x{s}" for s in PNG_SIZES] + ["scalable"]:
        for ext in (".png", ".svg"):
            candidates.append(data_home / "icons" / "hicolor" / size / "apps" / f"{APP_ID}{ext}")
    removed = []
    for path in candidates:
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed


def refresh_caches(data_home: Path) -> list[str]:
    """Tell the desktop about the change where its tools exist; returns what could not run.
    (Menus also notice new files by themselves; this only makes it immediate.)"""
    problems = []
    for tool, target in (("update-desktop-database", data_home / "applications"),
                         ("gtk-update-icon-cache", data_home / "icons" / "hicolor")):
        exe = shutil.which(tool)
        if exe is None or not target.is_dir():
            continue
        args = [exe, "-q", str(target)] if tool == "update-desktop-database" else [exe, "-qtf", str(target)]
        try:
            subprocess.run(args, check=True, timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{tool}: {exc}")
    return problems


def register(sub: Any) -> None:
    p = sub.add_parser("install-desktop", help="add SAPO Swarm to this user's application menu (Linux)")
    p.add_argument("--data-home", type=Path, default=None, help="default: $XDG_DATA_HOME or ~/.local/share")
    p.add_argument("--exec", dest="executable", default=None, metavar="PATH",
                   help="the sapo executable the entry runs (default: this one)")
    p.add_argument("--autostart", action="store_true", help="also start contributing at login")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=run_install)
    u = sub.add_parser("uninstall-desktop", help="remove the menu entry, its icons and the login entry")
    u.add_argument("--data-home", type=Path, default=None, help="default: $XDG_DATA_HOME or ~/.local/share")
    u.add_argument("--json", action="store_true", help="print what was removed as JSON")
    u.set_defaults(func=run_uninstall)
    a = sub.add_parser("autostart", help="start contributing at login: on | off | status")
    a.add_argument("action", choices=("on", "off", "status"))
    a.add_argument("--exec", dest="executable", default=None, metavar="PATH",
                   help="the sapo executable to start (default: this one)")
    a.set_defaults(func=run_autostart)


def _command(executable: str | None, *args: str, windowed: bool = False) -> list[str]:
    if executable is None:
        return [*autostart.self_command(windowed=windowed), *args]
    path = Path(executable).expanduser().resolve()
    if not path.is_file():
        raise SystemExit(f"--exec {executable}: no such file")
    return [str(path), *args]


def _linux_only(what: str) -> None:
    if sys.platform == "darwin" or sys.platform.startswith("win"):
        raise SystemExit(f"sapo {what} is for Linux desktops; on macOS drag 'SAPO Swarm.app' to "
                         "Applications, on Windows use the shortcuts of 'SAPO Swarm.exe' (docs/PACKAGING.md)")


def run_install(args: argparse.Namespace) -> int:
    _linux_only("install-desktop")
    data_home = (args.data_home or autostart.xdg_data_home()).expanduser()
    icons = icon_files()
    if not icons:
        print("warning: no icon files found; the entry will show a generic icon", file=sys.stderr)
    written = install(data_home, _command(args.executable, "gui"), icons)
    if args.autostart:
        login = _command(args.executable, "run", "--headless", "--control", windowed=True)
        written.append(Path(autostart.enable(login)))
    problems = refresh_caches(data_home)
    if args.json:
        print(json.dumps({"written": [str(p) for p in written], "warnings": problems}, indent=1))
    else:
        for path in written:
            print(f"wrote {path}")
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        print("SAPO Swarm is in the application menu (log out and in if your menu does not refresh).")
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    _linux_only("uninstall-desktop")
    data_home = (args.data_home or autostart.xdg_data_home()).expanduser()
    removed = uninstall(data_home)
    if autostart.disable():
        removed.append(autostart.LinuxAutostart(autostart.xdg_config_home()).path)
    refresh_caches(data_home)
    if args.json:
        print(json.dumps({"removed": [str(p) for p in removed]}, indent=1))
    else:
        print("\n".join(f"removed {p}" for p in removed) or "nothing to remove")
    return 0


def run_autostart(args: argparse.Namespace) -> int:
    if args.action == "on":
        where = autostart.enable(_command(args.executable, "run", "--headless", "--control", windowed=True))
        print(f"starts at login: {where}")
    elif args.action == "off":
        print("removed the login entry" if autostart.disable() else "no login entry was registered")
    else:
        print("on" if autostart.is_enabled() else "off")
    return 0
