"""The product's wheel holds the engine and the app only, under an SPDX licence; the lab reaches `sapo`
through the `sapo.commands` entry points, and a `sapo` without it says where its commands come from."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_packs_engine_and_app_and_no_lab(tmp_path: Path) -> None:
    # Built from a copy: setuptools keeps build/ in the source tree, and stale files there would be packed.
    source = tmp_path / "src"
    for name in ("engine", "app", "lab"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("sapo_swarm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    roots = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert roots == {"engine", "app"}
    assert "engine/cli/__init__.py" in names and "app/main.py" in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text


def test_the_checkouts_lab_registers_its_commands_through_the_entry_point() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "fit", "--option", "rounds=1"])
    assert args.func.__module__.startswith("lab.")


def test_without_the_lab_sapo_bench_says_where_it_comes_from(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["bench", "poisoning", "--option", "rounds=3"]) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err and "make install" in err
    assert cli.main(["experiment"]) == 2
