"""`sapo install-desktop` / `uninstall-desktop` / `autostart` into temp XDG dirs, the icon files, and
the bundle entry point's argv handling."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from tests_packaging_helpers import ROOT, load

from engine.cli import main
from engine.cli.desktop import PNG_SIZES, icon_files


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    data, config = tmp_path / "data", tmp_path / "config"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("PATH", "/nonexistent")  # no update-desktop-database: the files alone must do
    return data, config


def test_install_and_uninstall_desktop(xdg: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    data, config = xdg
    assert main(["install-desktop", "--autostart", "--json"]) == 0
    written = [Path(p) for p in json.loads(capsys.readouterr().out)["written"]]
    entry = data / "applications" / "sapo-swarm.desktop"
    login = config / "autostart" / "sapo-swarm.desktop"
    assert entry in written and login in written and all(p.is_file() for p in written)
    text = entry.read_text()
    assert "Name=SAPO Swarm\n" in text and "Icon=sapo-swarm\n" in text
    exec_line = next(line for line in text.splitlines() if line.startswith("Exec="))
    assert exec_line.endswith(" -m engine gui") and sys.executable in exec_line  # this venv, the app
    assert "run --headless --control" in login.read_text()
    for size in PNG_SIZES:
        icon = data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "sapo-swarm.png"
        assert png_size(icon.read_bytes()) == (size, size)
    svg = data / "icons" / "hicolor" / "scalable" / "apps" / "sapo-swarm.svg"
    assert svg.read_text().startswith("<svg")

    assert main(["autostart", "status"]) == 0
    assert capsys.readouterr().out.strip() == "on"
    assert main(["uninstall-desktop", "--json"]) == 0
    removed = {Path(p) for p in json.loads(capsys.readouterr().out)["removed"]}
    assert removed == set(written)
    assert not any(p.is_file() for p in (data.rglob("*") if data.exists() else []))
    assert main(["autostart", "status"]) == 0
    assert capsys.readouterr().out.strip() == "off"


def test_install_desktop_with_an_explicit_executable(xdg: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    exe = tmp_path / "My Bundle" / "sapo"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    assert main(["install-desktop", "--exec", str(exe)]) == 0
    capsys.readouterr()
    text = (xdg[0] / "applications" / "sapo-swarm.desktop").read_text()
    assert f'Exec="{exe}" gui\n' in text
    with pytest.raises(SystemExit, match="no such file"):
        main(["install-desktop", "--exec", str(tmp_path / "missing")])


def test_icon_files_cover_every_size_and_containers_parse() -> None:
    found = icon_files()
    assert set(found) == {f"{s}x{s}" for s in PNG_SIZES} | {"scalable"}
    ico = (ROOT / "packaging" / "icons" / "sapo-swarm.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    assert (reserved, kind) == (0, 1) and count >= 6
    for i in range(count):
        w, _, _, _, _, _, length, offset = struct.unpack("<BBBBHHII", ico[6 + 16 * i: 22 + 16 * i])
        assert png_size(ico[offset:offset + length])[0] == (w or 256)
    icns = (ROOT / "packaging" / "icons" / "sapo-swarm.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    pos, kinds = 8, {}
    while pos < len(icns):
        kind_b, length = icns[pos:pos + 4], struct.unpack(">I", icns[pos + 4:pos + 8])[0]
        kinds[kind_b] = png_size(icns[pos + 8:pos + length])[0]
        pos += length
    assert kinds[b"ic10"] == 1024 and kinds[b"ic07"] == 128


def test_icon_writers_on_hand_built_images() -> None:
    icons = load("make_icons")
    fake = {16: b"\x89PNG\r\n\x1a\n" + b"A" * 20, 256: b"\x89PNG\r\n\x1a\n" + b"B" * 30}
    ico = icons.ico_bytes(fake)
    assert struct.unpack("<HHH", ico[:6]) == (0, 1, 2)
    first = struct.unpack("<BBBBHHII", ico[6:22])
    second = struct.unpack("<BBBBHHII", ico[22:38])
    assert first[0] == 16 and second[0] == 0  # 0 encodes 256
    assert ico[first[7]:first[7] + first[6]] == fake[16] and ico[second[7]:] == fake[256]
    icns = icons.icns_bytes(fake)
    assert icns[8:12] == b"icp4" and struct.unpack(">I", icns[12:16])[0] == 8 + len(fake[16])
    assert icns.endswith(fake[256]) and b"ic08" in icns


def test_bundle_argv() -> None:
    entry = load("sapo_entry")
    assert entry.bundle_argv([]) == ["start"]  # double-click / menu: the app
    assert entry.bundle_argv(["doctor", "--json"]) == ["doctor", "--json"]
    # the GUI's engine launcher runs `sys.executable -m engine run ...`: the bundle is sys.executable
    assert entry.bundle_argv(["-m", "engine", "run", "--headless"]) == ["run", "--headless"]
    assert entry.bundle_argv(["-m", "engine.cli", "doctor"]) == ["doctor"]
    with pytest.raises(SystemExit, match="only run `-m engine`"):
        entry.bundle_argv(["-m", "http.server"])
