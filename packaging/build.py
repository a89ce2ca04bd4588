"""`make package`: build the one-folder bundle with PyInstaller, measure it, and pack a tarball.

    .venv/bin/python packaging/build.py                 # dist/sapo/ + dist/sapo-swarm-<v>-linux-<arch>.tar.gz
    .venv/bin/python packaging/build.py --no-excludes   # keep everything (to measure what exclusions save)

Runs at the lowest CPU priority (nice 19): a build takes minutes of both cores and must not starve a
node or the tests running beside it. Writes dist/package-report.json with the size and build time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # isa_check, llama_portable
SPEC = ROOT / "packaging" / "sapo.spec"
MIN_FREE_BYTES = 6 * 1024**3  # PyInstaller's work dir + the bundle + the tarball, with margin
MIB = 1024**2


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def largest_parts(bundle: Path, top: int = 15) -> list[tuple[str, int]]:
    """Size per package folder inside the bundle (what to look at to make it smaller)."""
    internal = bundle / "_internal" if (bundle / "_internal").is_dir() else bundle
    sizes: dict[str, int] = {}
    for path in internal.rglob("*"):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(internal).parts
            key = "/".join(rel[:2]) if rel[0] in ("PySide6", "torch") and len(rel) > 2 else rel[0]
            sizes[key] = sizes.get(key, 0) + path.stat().st_size
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


TARBALL_README = """SAPO Swarm {version} for Linux ({machine}): no Python needed.

  ./sapo install-desktop      add SAPO Swarm to your application menu (per user; run it again
                              after moving this folder; --autostart also starts it at login)
  ./sapo                      the app (a headless node where there is no display)
  ./sapo run --solo           a headless node on the bundled seed model, offline
  ./sapo doctor               what this machine can train
  ./sapo uninstall-desktop    remove the menu entry, icons and login entry

Your data (identity, settings, checkpoints) lives in ~/.local/share/sapo-swarm.
"""


def make_tarball(bundle: Path, out: Path, top_dir: str, readme: str) -> None:
    """gzip level 6: a good size/time trade for ~1 GB of mostly shared libraries."""
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname=top_dir)
        data = readme.encode("utf-8")
        info = tarfile.TarInfo(f"{top_dir}/README.txt")
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))


def build(args: argparse.Namespace) -> dict[str, Any]:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    dist, work = ROOT / args.dist, ROOT / args.work
    free = shutil.disk_usage(ROOT).free
    if free < MIN_FREE_BYTES:
        raise SystemExit(f"only {free / 1024**3:.1f} GiB free; a build needs "
                         f"{MIN_FREE_BYTES / 1024**3:.0f} GiB")
    seed = ROOT / "resources" / "models" / "seed" / "config.json"
    if not seed.exists():
        print("warning: resources/models/seed has no model yet; the bundle will carry none", file=sys.stderr)
    env = dict(os.environ)
    llama_isa: dict[str, Any] | None = None
    if not args.native_llama:
        import isa_check
        from llama_portable import ensure_portable_llama

        lib_dir = ensure_portable_llama()
        llama_isa = isa_check.check_dir(lib_dir)
        if not llama_isa["ok"]:
            raise SystemExit("the portable llama.cpp build needs more than the baseline CPU: "
                             + "; ".join(llama_isa["problems"]))
        env["SAPO_LLAMA_LIB_DIR"] = str(lib_dir)
    if args.no_excludes:
        env["SAPO_BUNDLE_NO_EXCLUDES"] = "1"
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
           "--distpath", str(dist), "--workpath", str(work), str(SPEC)]
    print("$ " + " ".join(cmd), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    build_s = time.monotonic() - started
    bundle = dist / ("SAPO Swarm.app" if sys.platform == "darwin" else "sapo")
    report: dict[str, Any] = {
        "version": version, "platform": sys.platform, "machine": platform.machine(),
        "bundle": str(bundle.relative_to(ROOT)), "excludes": not args.no_excludes,
        "build_seconds": round(build_s, 1), "bundle_bytes": tree_size(bundle),
        "seed_model_bytes": tree_size(bundle / "_internal" / "resources" / "models" / "seed")
        if (bundle / "_internal" / "resources" / "models" / "seed").exists() else 0,
        "largest_parts": largest_parts(bundle),
    }
    bundled_llama = next((p for p in (bundle / "_internal" / "llama_cpp" / "lib", bundle / "llama_cpp" / "lib")
                          if p.is_dir()), None)
    if bundled_llama is not None:  # what was really bundled, checked again
        import isa_check

        bundled = isa_check.check_dir(bundled_llama)
        report["llama_cpp"] = {"portable": llama_isa is not None, "cpu_variants": bundled["cpu_variants"],
                               "isa_ok": bundled["ok"], "problems": bundled["problems"]}
        if llama_isa is not None and not bundled["ok"]:
            raise SystemExit("the bundle's llama.cpp needs more than the baseline CPU: " + "; ".join(bundled["problems"]))
    excluded = work / "sapo" / "excluded.json"
    if excluded.exists():
        dropped = json.loads(excluded.read_text())
        report["dropped_files_bytes"] = sum(size for _, size in dropped["binaries"] + dropped["datas"])
        report["excluded_modules"] = len(dropped["modules"])
    if sys.platform.startswith("linux") and not args.no_tarball:
        started = time.monotonic()
        tarball = dist / f"sapo-swarm-{version}-linux-{platform.machine()}.tar.gz"
        make_tarball(bundle, tarball, f"sapo-swarm-{version}",
                     TARBALL_README.format(version=version, machine=platform.machine()))
        report.update(tarball=str(tarball.relative_to(ROOT)), tarball_bytes=tarball.stat().st_size,
                      tarball_seconds=round(time.monotonic() - started, 1))
    (dist / ("package-report-full.json" if args.no_excludes else "package-report.json")).write_text(
        json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-excludes", action="store_true", help="bundle everything PyInstaller finds")
    parser.add_argument("--no-tarball", action="store_true", help="only the folder")
    parser.add_argument("--native-llama", action="store_true",
                        help="bundle the venv's llama.cpp (compiled for this CPU only: a quick local build, not a release)")
    parser.add_argument("--dist", default="dist", help="output folder (relative to the repo)")
    parser.add_argument("--work", default="build/pyinstaller", help="PyInstaller's work folder")
    args = parser.parse_args(argv)
    if hasattr(os, "nice"):
        os.nice(19)  # the children (PyInstaller and its analysis processes) inherit it
    report = build(args)
    print(f"bundle {report['bundle']}: {int(report['bundle_bytes']) / MIB:.0f} MiB "
          f"(seed model {int(report['seed_model_bytes']) / MIB:.1f} MiB), "
          f"built in {report['build_seconds']} s")
    if "tarball" in report:
        print(f"tarball {report['tarball']}: {int(report['tarball_bytes']) / MIB:.0f} MiB "
              f"in {report['tarball_seconds']} s")
    for name, size in report["largest_parts"]:
        print(f"  {size / MIB:8.1f} MiB  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
