"""Start at login: the XDG autostart entry for real in a temp config home; the LaunchAgent and Run-key
contents as pure functions (and the LaunchAgent file in a temp home)."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engine import autostart

AWKWARD = ["/opt/My Apps/sapo $HOME/100%\\x", "run", "--data-dir", '/tmp/a "quoted" `dir`', "plain"]


def parse_entry(text: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(text)
    return dict(parser["Desktop Entry"])


def split_exec(value: str) -> list[str]:
    """Undo exec_line the way a desktop does: string-value unescape, %% -> %, then the Exec quoting
    rules (an independent reading of the spec, not a call back into the code under test)."""
    value = value.replace("%%", "\0pct")
    unescaped, i = "", 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            escapes = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
            unescaped += escapes.get(value[i + 1], "\\" + value[i + 1])
            i += 2
        else:
            unescaped += value[i]
            i += 1
    args, cur, quoted, i, started = [], "", False, 0, False
    while i < len(unescaped):
        ch = unescaped[i]
        if quoted and ch == "\\":
            cur += unescaped[i + 1]
            i += 2
            continue
        if ch == '"':
            quoted, started = not quoted, True
        elif ch == " " and not quoted:
            if started or cur:
                args.append(cur)
            cur, started = "", False
        else:
            cur += ch
        i += 1
    if started or cur:
        args.append(cur)
    return [a.replace("\0pct", "%") for a in args]


def test_exec_line_round_trips_awkward_arguments() -> None:
    line = autostart.exec_line(AWKWARD)
    assert split_exec(line) == AWKWARD
    assert "%%" in line  # a bare % would be read as a field code
    assert autostart.exec_line(["/usr/bin/sapo", "gui"]) == "/usr/bin/sapo gui"


@pytest.mark.parametrize("bad", [[], [""], ["/bin/sapo", "a\nb"], ["/bin/sapo\0"], ["x" * 3000]])
def test_commands_that_cannot_be_written_are_refused(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        autostart.exec_line(bad)
    with pytest.raises(ValueError):
        autostart.launch_agent_plist(bad)
    with pytest.raises(ValueError):
        autostart.windows_run_value(bad)


def test_linux_autostart_in_a_temp_config_home(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    where: dict[str, Any] = {"platform": "linux", "environ": env, "home": tmp_path / "home"}
    assert not autostart.is_enabled(**where)
    assert autostart.disable(**where) is False
    command = ["/opt/sapo swarm/sapo", "run", "--headless", "--control"]
    path = Path(autostart.enable(command, **where))
    assert path == tmp_path / "cfg" / "autostart" / "sapo-swarm.desktop"
    keys = parse_entry(path.read_text())
    assert keys["Type"] == "Application" and keys["Name"] == "SAPO Swarm"
    assert split_exec(keys["Exec"]) == command
    assert keys["X-GNOME-Autostart-enabled"] == "true"
    assert autostart.is_enabled(**where)
    # A desktop's "startup applications" panel switches an entry off with Hidden=true.
    path.write_text(path.read_text() + "Hidden=true\n")
    assert not autostart.is_enabled(**where)
    autostart.sync(True, command, **where)  # re-enabling rewrites the entry
    assert autostart.is_enabled(**where)
    autostart.sync(False, **where)
    assert not path.exists() and not autostart.is_enabled(**where)


def test_relative_xdg_config_home_is_ignored(tmp_path: Path) -> None:
    """The XDG spec: a relative XDG_CONFIG_HOME is invalid; fall back to ~/.config."""
    backend = autostart.backend("linux", {"XDG_CONFIG_HOME": "relative/cfg"}, tmp_path)
    assert isinstance(backend, autostart.LinuxAutostart)
    assert backend.path == tmp_path / ".config" / "autostart" / "sapo-swarm.desktop"


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
@pytest.mark.parametrize("as_autostart", [False, True])
def test_entries_pass_desktop_file_validate(tmp_path: Path, as_autostart: bool) -> None:
    path = tmp_path / "sapo-swarm.desktop"
    path.write_text(autostart.desktop_entry(AWKWARD, autostart=as_autostart))
    out = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr  # not even a hint


def test_launch_agent_plist_content() -> None:
    data = plistlib.loads(autostart.launch_agent_plist(AWKWARD, log_path=Path("/Users/a/Library/Logs/x.log")))
    assert data["Label"] == "org.sapo-swarm.engine"
    assert data["ProgramArguments"] == AWKWARD  # argv as a list: no shell quoting to get wrong
    assert data["RunAtLoad"] is True and data["KeepAlive"] is False
    assert data["ProcessType"] == "Background" and data["Nice"] > 0
    assert data["StandardOutPath"] == data["StandardErrorPath"] == "/Users/a/Library/Logs/x.log"


def test_mac_launch_agent_file_in_a_temp_home(tmp_path: Path) -> None:
    where: dict[str, Any] = {"platform": "darwin", "home": tmp_path}
    path = Path(autostart.enable(["/Applications/SAPO Swarm.app/Contents/MacOS/sapo", "run"], **where))
    assert path == tmp_path / "Library" / "LaunchAgents" / "org.sapo-swarm.engine.plist"
    assert plistlib.loads(path.read_bytes())["ProgramArguments"][1] == "run"
    assert autostart.is_enabled(**where)
    assert autostart.disable(**where) and not path.exists() and not autostart.is_enabled(**where)


def test_windows_run_value_quotes_like_createprocess() -> None:
    value = autostart.windows_run_value([r"C:\Program Files\SAPO Swarm\sapo.exe", "run", "--headless",
                                         "--data-dir", r"C:\Users\A B\data\\"])
    assert value == (r'"C:\Program Files\SAPO Swarm\sapo.exe" run --headless --data-dir '
                     r'"C:\Users\A B\data\\\\"')
    assert autostart.RUN_KEY == r"Software\Microsoft\Windows\CurrentVersion\Run"
    assert isinstance(autostart.backend("win32"), autostart.WindowsAutostart)


def test_default_command_runs_the_engine_joined_with_the_control_api() -> None:
    assert autostart.self_command(frozen=True, executable="/b/sapo") == ["/b/sapo"]
    assert autostart.self_command(frozen=False, executable="/v/python") == ["/v/python", "-m", "engine"]
    assert autostart.default_command()[-4:] == ["run", "--headless", "--control", "--supervised"]


def test_windows_login_uses_the_windowed_twin(tmp_path: Path) -> None:
    """A console sapo.exe at every login would flash a terminal: the bundle's windowed twin runs instead."""
    exe = tmp_path / "sapo.exe"
    exe.write_bytes(b"MZ")
    assert autostart.self_command(frozen=True, executable=str(exe), windowed=True) == [str(exe)]
    (tmp_path / autostart.WINDOWS_GUI_EXE).write_bytes(b"MZ")
    assert autostart.self_command(frozen=True, executable=str(exe), windowed=True) == [
        str(tmp_path / autostart.WINDOWS_GUI_EXE)]
    assert autostart.self_command(frozen=True, executable=str(exe)) == [str(exe)]  # the CLI stays a console


def test_node_setting_registers_and_removes_the_login_entry(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """ContributorSettings.start_at_login through a real Node: the XDG entry follows the setting and
    names the node's data dir; an OS refusal is a clear ValueError and the setting stays off."""
    import asyncio

    from engine.models.policy import build_tiny_policy
    from engine.node import Node, NodeConfig
    from engine.sapo.config import preset

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    model = build_tiny_policy(tmp_path / "model")
    data = tmp_path / "data dir"
    node = Node(NodeConfig(data_dir=data, model=str(model), sapo=preset("cpu-small"), solo=True))
    entry = tmp_path / "cfg" / "autostart" / "sapo-swarm.desktop"
    try:
        asyncio.run(node.update_settings({"start_at_login": True}))
        keys = parse_entry(entry.read_text())
        assert split_exec(keys["Exec"])[-6:] == ["run", "--headless", "--control", "--supervised", "--data-dir", str(data)]
        asyncio.run(node.update_settings({"start_at_login": False}))
        assert not entry.exists()
        entry.parent.rmdir()
        entry.parent.write_text("a file where the folder should be")  # the OS refuses the write
        with pytest.raises(ValueError, match="could not register start at login"):
            asyncio.run(node.update_settings({"start_at_login": True}))
        assert node.get_settings()["start_at_login"] is False
    finally:
        node.store.close()
