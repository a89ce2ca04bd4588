"""Start at login (ContributorSettings.start_at_login) through each platform's own mechanism.

- Linux (and other XDG desktops): `$XDG_CONFIG_HOME/autostart/sapo-swarm.desktop`.
- macOS: a LaunchAgent, `~/Library/LaunchAgents/org.sapo-swarm.engine.plist` (loaded at next login).
- Windows: the per-user Run key, `HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run`.

The file and registry contents are pure functions (tested on every OS); the backends only write them.
No admin rights anywhere: everything is per user. Also home of the XDG desktop-entry writer, which
`sapo install-desktop` shares.
"""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

APP_ID = "sapo-swarm"  # desktop file id and icon name (matches QGuiApplication.desktopFileName)
APP_NAME = "SAPO Swarm"  # what menus and the Windows Run key show
LAUNCH_AGENT_LABEL = "org.sapo-swarm.engine"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
MAX_COMMAND_CHARS = 2048  # the Run key's value is limited to 260 chars for some tools; paths stay short


WINDOWS_GUI_EXE = "SAPO Swarm.exe"  # the bundle's windowed twin of sapo.exe (packaging/sapo.spec)


def self_command(frozen: bool | None = None, executable: str | None = None,
                 windowed: bool = False) -> list[str]:
    """How to run `sapo` from here: the bundle's own executable, or this interpreter with `-m engine`.
    `windowed`: on Windows prefer the bundle's windowed twin, so a login or a shortcut opens no console."""
    frozen = getattr(sys, "frozen", False) if frozen is None else frozen
    exe = executable or sys.executable
    if not frozen:
        return [exe, "-m", "engine"]
    twin = Path(exe).with_name(WINDOWS_GUI_EXE)
    return [str(twin)] if windowed and exe.lower().endswith(".exe") and twin.is_file() else [exe]


def default_command() -> list[str]:
    """What a login starts: the engine, joined, serving the control API so the app can attach later
    (the app's window at every login would be a nuisance; BOINC and F@H start their client the same way),
    supervised: restarted when it dies (engine/supervisor.py)."""
    return [*self_command(windowed=True), "run", "--headless", "--control", "--supervised"]


def engine_command(data_dir: Path | None = None) -> list[str]:
    """default_command() for a node whose data dir is not the default one."""
    return default_command() + (["--data-dir", str(data_dir)] if data_dir is not None else [])


def apply_setting(enabled: bool, data_dir: Path | None = None, **where: Any) -> None:
    """What the node calls when ContributorSettings.start_at_login changes. Raises ValueError with
    the reason when the OS refuses (a read-only home, a locked registry), so the setting is not saved
    as on while nothing starts at login."""
    try:
        sync(enabled, engine_command(data_dir) if enabled else None, **where)
    except OSError as exc:
        raise ValueError(f"could not {'register' if enabled else 'remove'} start at login: {exc}") from exc


def _check_command(command: Sequence[str]) -> list[str]:
    cmd = [str(part) for part in command]
    if not cmd or not cmd[0]:
        raise ValueError("the autostart command must name an executable")
    if any(ch in part for part in cmd for ch in "\n\r\0"):
        raise ValueError("the autostart command must not contain line breaks or NUL characters")
    if sum(len(p) + 3 for p in cmd) > MAX_COMMAND_CHARS:
        raise ValueError("the autostart command is too long")
    return cmd


# --- XDG desktop entries (menu entry and Linux autostart) ---------------------------------------------

_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`=%")


def exec_quote(arg: str) -> str:
    """One argument of an Exec key (Desktop Entry Specification, "The Exec key")."""
    if arg and not (set(arg) & _EXEC_RESERVED):
        return arg
    inner = "".join("\\" + ch if ch in '"`$\\' else ch for ch in arg)
    return '"' + inner + '"'


def exec_line(command: Sequence[str]) -> str:
    """The Exec value as written in the file: quoted per argument, then escaped as a string value
    (a backslash doubles again), and `%` doubled because field codes start with it."""
    quoted = " ".join(exec_quote(a) for a in _check_command(command))
    return quoted.replace("\\", "\\\\").replace("%", "%%")


def _string_value(text: str) -> str:
    if any(ch in text for ch in "\n\r\0"):
        raise ValueError("desktop entry values must be one line")
    return text.replace("\\", "\\\\")


def desktop_entry(command: Sequence[str], *, name: str = APP_NAME, icon: str = APP_ID,
                  comment: str = "Lend this computer to a swarm that post-trains language models",
                  autostart: bool = False) -> str:
    """A Desktop Entry file: the menu entry, or (autostart=True) the XDG autostart entry."""
    lines = [
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",  # the newest version desktop-file-utils 0.26 knows
        f"Name={_string_value(name)}",
        f"Comment={_string_value(comment)}",
        f"Exec={exec_line(command)}",
        f"Icon={_string_value(icon)}",
        "Terminal=false",
    ]
    if autostart:
        lines += ["X-GNOME-Autostart-enabled=true", "NoDisplay=true"]
    else:
        lines += ["Categories=Science;ArtificialIntelligence;", "Keywords=AI;RL;swarm;volunteer;training;",
                  f"StartupWMClass={APP_ID}", "StartupNotify=true"]
    return "\n".join(lines) + "\n"


def xdg_config_home(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    env = os.environ if environ is None else environ
    value = env.get("XDG_CONFIG_HOME", "")
    # The spec says a relative value is invalid and must be ignored.
    return Path(value) if value and os.path.isabs(value) else (home or Path.home()) / ".config"


def xdg_data_home(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    env = os.environ if environ is None else environ
    value = env.get("XDG_DATA_HOME", "")
    return Path(value) if value and os.path.isabs(value) else (home or Path.home()) / ".local" / "share"


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Temp file + rename, so a desktop session never reads half an entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    os.replace(tmp, path)


# --- macOS LaunchAgent and Windows Run key: contents ----------------------------------------------------

def launch_agent_plist(command: Sequence[str], label: str = LAUNCH_AGENT_LABEL,
                       log_path: Path | None = None) -> bytes:
    """A LaunchAgent that starts the command once at login, at a lower CPU priority, not restarted
    when it exits (leaving the swarm from the app must stay left until the next login)."""
    plist: dict[str, object] = {
        "Label": label,
        "ProgramArguments": _check_command(command),
        "RunAtLoad": True,
        "KeepAlive": False,
        "ProcessType": "Background",  # launchd throttles it in favour of the user's apps
        "Nice": 10,
    }
    if log_path is not None:
        plist["StandardOutPath"] = plist["StandardErrorPath"] = str(log_path)
    return plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=True)


def windows_run_value(command: Sequence[str]) -> str:
    """The Run key's REG_SZ value: one command line, quoted the way CreateProcess splits it."""
    return subprocess.list2cmdline(_check_command(command))


# --- backends ------------------------------------------------------------------------------------------

class _FileAutostart:
    """An OS mechanism that is one file: removing it switches start-at-login off."""

    path: Path

    def disable(self) -> bool:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True


class LinuxAutostart(_FileAutostart):
    def __init__(self, config_home: Path) -> None:
        self.path = config_home / "autostart" / f"{APP_ID}.desktop"

    def enable(self, command: Sequence[str]) -> str:
        write_text_atomic(self.path, desktop_entry(command, autostart=True))
        return str(self.path)

    def is_enabled(self) -> bool:
        # A user (or a desktop's settings panel) may switch an entry off with Hidden=true.
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return False
        keys = {line.split("=", 1)[0].strip(): line.split("=", 1)[1].strip()
                for line in text.splitlines() if "=" in line}
        hidden = keys.get("Hidden", "false") == "true"
        return not hidden and keys.get("X-GNOME-Autostart-enabled", "true") != "false"


class MacAutostart(_FileAutostart):
    def __init__(self, agents_dir: Path, log_path: Path | None = None) -> None:
        self.path = agents_dir / f"{LAUNCH_AGENT_LABEL}.plist"
        self.log_path = log_path

    def enable(self, command: Sequence[str]) -> str:
        write_text_atomic(self.path, launch_agent_plist(command, log_path=self.log_path))
        return str(self.path)

    def is_enabled(self) -> bool:
        return self.path.is_file()


def _winreg() -> Any:
    """The winreg module (Windows only; typed loosely so the file type-checks on every OS)."""
    import winreg

    return winreg


def _on_run_value(winreg: Any, access: int, act: Callable[[Any, str], object]) -> bool:
    """`act(key, APP_NAME)` on the Run key opened for `access`; False when the key or the value is missing."""
    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, access) as key:
            act(key, APP_NAME)
    except FileNotFoundError:
        return False
    return True


class WindowsAutostart:
    """HKCU Run key through winreg."""

    def enable(self, command: Sequence[str]) -> str:
        winreg = _winreg()
        with winreg.CreateKeyEx(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.SetValueEx(key, APP_NAME, 0, winreg.REG_SZ, windows_run_value(command))
        return f"HKCU\\{RUN_KEY}\\{APP_NAME}"

    def disable(self) -> bool:
        winreg = _winreg()
        return _on_run_value(winreg, winreg.KEY_SET_VALUE, winreg.DeleteValue)

    def is_enabled(self) -> bool:
        winreg = _winreg()
        return _on_run_value(winreg, winreg.KEY_QUERY_VALUE, winreg.QueryValueEx)


Backend = LinuxAutostart | MacAutostart | WindowsAutostart


def backend(platform: str | None = None, environ: Mapping[str, str] | None = None,
            home: Path | None = None) -> Backend:
    """The mechanism for this platform (arguments let tests aim it at a temp home)."""
    platform = sys.platform if platform is None else platform
    if platform.startswith("win"):
        return WindowsAutostart()
    if platform == "darwin":
        base = home or Path.home()
        return MacAutostart(base / "Library" / "LaunchAgents", base / "Library" / "Logs" / f"{APP_ID}.log")
    return LinuxAutostart(xdg_config_home(environ, home))


def enable(exe_cmd: Sequence[str] | None = None, *, platform: str | None = None,
           environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Register `exe_cmd` (default: `default_command()`) to start at login; returns where it went.
    Rewritten even if present: the bundle may have moved since."""
    return backend(platform, environ, home).enable(default_command() if exe_cmd is None else exe_cmd)


def disable(*, platform: str | None = None, environ: Mapping[str, str] | None = None,
            home: Path | None = None) -> bool:
    """Unregister; False if nothing was registered."""
    return backend(platform, environ, home).disable()


def is_enabled(*, platform: str | None = None, environ: Mapping[str, str] | None = None,
               home: Path | None = None) -> bool:
    return backend(platform, environ, home).is_enabled()


def sync(enabled: bool, exe_cmd: Sequence[str] | None = None, *, platform: str | None = None,
         environ: Mapping[str, str] | None = None, home: Path | None = None) -> None:
    """Make the OS match the setting: call after ContributorSettings.start_at_login changes."""
    if enabled:
        enable(exe_cmd, platform=platform, environ=environ, home=home)
    else:
        disable(platform=platform, environ=environ, home=home)
