"""llama.cpp for the desktop bundle, compiled to run on any x86-64 CPU and fast on each.

The developer install (`make test`) compiles llama-cpp-python for the machine it runs on (quick to
build, fastest there). A bundle runs on other people's CPUs, so `make package` builds the same pinned
version again with
    GGML_NATIVE=OFF          no -march=native anywhere
    GGML_BACKEND_DL=ON       the CPU backend is a plugin loaded at run time
    GGML_CPU_ALL_VARIANTS=ON one plugin per x86-64 level (x64, sse42, haswell, skylakex, icelake, ...):
                             ggml loads the best one this CPU supports (engine/models/llamacpp.py
                             `load_cpu_backends`), so AVX512/bf16 are used where present
and takes its `llama_cpp/lib` plus the CPU plugins (installed under the wheel's `bin/`), leaving out
libmtmd (multimodal; the engine never loads it). The build is cached per version under build/llama-portable/ (a first
build compiles every variant: about half an hour on 2 cores). packaging/isa_check.py then proves that
only the dispatched variants use more than the baseline instruction set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "llama-portable"
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"


def pinned_version() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for req in extras["llamacpp"]:
        match = re.fullmatch(r"llama-cpp-python==([0-9][0-9a-z.]*)", req.strip())
        if match:
            return match.group(1)
    raise RuntimeError("pyproject.toml pins no llama-cpp-python version in the llamacpp extra")


def ensure_portable_llama(version: str | None = None, cache: Path = CACHE) -> Path:
    """The lib dir of the portable build of `version` (built once, then reused)."""
    version = version or pinned_version()
    lib_dir = cache / version / "lib"
    if (lib_dir / "libggml-cpu-x64.so").is_file() or (lib_dir / "ggml-cpu-x64.dll").is_file():
        return lib_dir
    wheels = cache / version / "wheel"
    built = sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))
    if not built:  # compile (the wheel stays: a lost lib dir is re-extracted, not rebuilt)
        shutil.rmtree(wheels, ignore_errors=True)
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "FORCE_CMAKE": "1"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary",
               "llama-cpp-python", f"llama-cpp-python=={version}", "-w", str(wheels)]
        print("$ CMAKE_ARGS='" + CMAKE_ARGS + "' " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
        built = sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))
    return extract_lib(built[-1], lib_dir)


def extract_lib(wheel: Path, lib_dir: Path) -> Path:
    """The wheel's llama_cpp/lib files -> lib_dir (replaced whole, atomically)."""
    tmp = lib_dir.with_name("lib.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            base = Path(name).name
            # the libraries llama_cpp loads, and the CPU plugins (the wheel installs those under bin/);
            # not libmtmd (multimodal, which the engine never loads)
            wanted = (name.startswith("llama_cpp/lib/") and not name.endswith("/")) or \
                (name.startswith("bin/") and base.startswith(("libggml-cpu-", "ggml-cpu-")))
            if wanted and not base.startswith(("libmtmd", "mtmd")):
                (tmp / base).write_bytes(zf.read(name))
    shutil.rmtree(lib_dir, ignore_errors=True)
    os.replace(tmp, lib_dir)
    return lib_dir


if __name__ == "__main__":
    print(ensure_portable_llama())
