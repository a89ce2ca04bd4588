"""Opt-in (`-m packaging`, ~10-20 min on 2 cores): build the bundle, then use it the way a contributor
does, with no Python on PATH, no venv, a fresh HOME and no network (HF_HUB_OFFLINE).

    .venv/bin/pytest -m packaging tests/packaging                         # builds into build/test-dist
    SAPO_BUNDLE_DIR=dist/sapo .venv/bin/pytest -m packaging tests/packaging   # tests `make package`'s bundle
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.packaging, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def bundle() -> Path:
    given = os.environ.get("SAPO_BUNDLE_DIR")
    if given:
        path = Path(given).resolve()
    else:
        pytest.importorskip("PyInstaller", reason="pip install -e '.[package]'")
        subprocess.run([sys.executable, str(ROOT / "packaging" / "build.py"), "--no-tarball",
                        "--dist", "build/test-dist", "--work", "build/test-work"], check=True, cwd=ROOT,
                       timeout=3300)
        path = ROOT / "build" / "test-dist" / "sapo"
    assert (path / "sapo").is_file() and os.access(path / "sapo", os.X_OK), path
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """What a desktop session gives the app: system PATH only, its own HOME, offline."""
    home = tmp_path / "home"
    home.mkdir()
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "QT_QPA_PLATFORM": "offscreen", "XDG_DATA_HOME": str(home / "share"),
            "XDG_CONFIG_HOME": str(home / "config")}


def sapo(bundle: Path, env: dict[str, str], cwd: Path, *args: str,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bundle / "sapo"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=timeout)


def needs_seed(bundle: Path) -> None:
    if not (bundle / "_internal" / "resources" / "models" / "seed" / "config.json").is_file():
        pytest.skip("the bundle carries no seed model (resources/models/seed was empty at build time)")


def test_no_python_on_path(env: dict[str, str]) -> None:
    found = subprocess.run(["sh", "-c", "command -v python3 python sapo || true"], env=env,
                           capture_output=True, check=False, text=True).stdout.split()
    assert not any(".venv" in path for path in found), found


def test_help_lists_every_command(bundle: Path, env: dict[str, str], tmp_path: Path) -> None:
    out = sapo(bundle, env, tmp_path, "--help", timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("run", "gui", "start", "doctor", "bootstrap", "install-desktop", "autostart"):
        assert command in out.stdout
    same = sapo(bundle, env, tmp_path, "-m", "engine", "--help", timeout=120)  # how the GUI starts the engine
    assert same.returncode == 0 and same.stdout == out.stdout


def test_doctor_json_offline(bundle: Path, env: dict[str, str], tmp_path: Path) -> None:
    needs_seed(bundle)
    out = sapo(bundle, env, tmp_path, "doctor", "--json", "--offline", "--no-probe", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["device"]["kind"] in ("cpu", "cuda", "mps")
    seed = [c for c in report["candidates"] if c["model"] == "seed"]
    assert seed and seed[0]["available"], "the bundled seed model must be found in the bundle"
    assert report["pick"]["model"]


def test_two_round_solo_node_on_the_seed_model(bundle: Path, env: dict[str, str], tmp_path: Path) -> None:
    needs_seed(bundle)
    data = tmp_path / "data"
    out = sapo(bundle, env, tmp_path, "run", "--solo", "--rounds", "2", "--no-mdns", "--model", "seed", "--data-dir",
               str(data),
               timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = [line for line in out.stdout.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in rounds] == ["1", "2"], out.stdout
    assert "state stopped" in out.stdout
    assert (data / "node.db").is_file()


def test_install_desktop_points_at_the_bundle(bundle: Path, env: dict[str, str], tmp_path: Path) -> None:
    out = sapo(bundle, env, tmp_path, "install-desktop", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    entry = Path(env["XDG_DATA_HOME"]) / "applications" / "sapo-swarm.desktop"
    assert f"Exec={bundle / 'sapo'} gui\n" in entry.read_text()
    icons = Path(env["XDG_DATA_HOME"]) / "icons" / "hicolor"
    assert (icons / "256x256" / "apps" / "sapo-swarm.png").is_file()
    assert (icons / "scalable" / "apps" / "sapo-swarm.svg").is_file()


@pytest.fixture
def gui_process(bundle: Path, env: dict[str, str],
                tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    data = tmp_path / "gui-data"
    proc = subprocess.Popen([str(bundle / "sapo"), "gui", "--data-dir", str(data)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc, data
    proc.terminate()
    proc.wait(timeout=30)
    # The engine outlives the window by design: stop the one this test started (its command line
    # names this test's own temp data dir), even if it never got as far as writing control.json.
    for other in psutil.process_iter(["pid", "cmdline"]):
        if str(data) in (other.info["cmdline"] or []):
            try:
                os.kill(other.info["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_app_starts_its_engine_from_the_bundle(bundle: Path,
                                               gui_process: tuple[subprocess.Popen[bytes], Path]) -> None:
    """`sapo gui` (offscreen) starts `sapo -m engine run --headless --control` from the bundle and
    connects: the path a double-click takes."""
    needs_seed(bundle)
    proc, data = gui_process
    control = data / "control.json"
    deadline = time.monotonic() + 240
    while not control.is_file():
        assert proc.poll() is None, f"the app exited with {proc.returncode}: {engine_log(data)}"
        assert time.monotonic() < deadline, f"no engine after 240 s: {engine_log(data)}"
        time.sleep(0.5)
    pid = int(json.loads(control.read_text())["pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].decode() == str(bundle / "sapo") and b"run" in cmdline
    assert proc.poll() is None  # the window is up


def engine_log(data: Path) -> str:
    log = data / "logs" / "engine.log"
    return log.read_text(errors="replace")[-3000:] if log.is_file() else "(no engine log)"
