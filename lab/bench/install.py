"""`sapo bench install`: what installing llama.cpp costs a newcomer, and what each build decodes.

Per llama.cpp build (llama-cpp-python, compiled on install; xllamacpp, prebuilt wheels): the seconds
to install it into an empty virtual environment with pip's cache bypassed (`--no-cache-dir`, so a
source build really compiles), whether that needed a compiler (a binary-only install is tried first),
and the node's own llama.cpp generator on SmolLM2-135M with each build loaded (`SAPO_LLAMA_LIB`):
tokens/s of a round of 8 prompts x 8 completions, in each build's automatic weights and in f16, and
its per-token log-probs against torch's. Decode runs one at a time on a quiet machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from engine.models.llama_lib import LIB_ENV, installed_builds
from lab import BENCH_DIR
from lab.bench import save_results

DESCRIPTION = "installing llama.cpp (seconds, compiler needed) and each build's decode tokens/s on SmolLM2"
LONG = True  # the source build compiles llama.cpp: minutes
PINS = {"llama-cpp-python": "llama-cpp-python==0.3.36", "xllamacpp": "xllamacpp==2026.10.11549"}
DECODE = ("import json, sys\nfrom lab.bench.generate import decode_rate\n"
          "print('DECODE ' + json.dumps(decode_rate(weights=sys.argv[1], repeats=int(sys.argv[2]))))\n")


def _pip(env_dir: Path, args: list[str], timeout_s: float) -> tuple[int, float, str]:
    started = time.perf_counter()
    done = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir",
                           "--no-deps", *args], check=False, capture_output=True, text=True, timeout=timeout_s)
    return done.returncode, time.perf_counter() - started, (done.stderr or "")[-400:]


def install_cost(build: str, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Seconds to install `build`'s pinned version into an empty venv; whether a compiler was needed."""
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / "venv"
        venv.create(env_dir, with_pip=True)
        rc, seconds, err = _pip(env_dir, ["--only-binary", ":all:", PINS[build]], timeout_s)
        compiled = rc != 0
        if compiled:  # no wheel for this platform: pip builds the sdist (cmake, a C++ compiler)
            rc, seconds, err = _pip(env_dir, [PINS[build]], timeout_s)
        return {"spec": PINS[build], "install_seconds": seconds, "compiler_needed": compiled, "ok": rc == 0,
                "error": err if rc else ""}


def decode(library: Path, weights: str, repeats: int, timeout_s: float = 1200.0) -> dict[str, Any]:
    """The node's generator with `library` loaded, in a fresh process (one llama.cpp per process)."""
    done = subprocess.run([sys.executable, "-c", DECODE, weights, str(repeats)], check=False, capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, LIB_ENV: str(library)})
    lines = [x for x in done.stdout.splitlines() if x.startswith("DECODE ")]
    if done.returncode or not lines:
        return {"error": (done.stderr or "no result")[-400:]}
    result: dict[str, Any] = json.loads(lines[-1][len("DECODE "):])
    return result


def run(out_dir: Path = BENCH_DIR, builds: list[str] | None = None, repeats: int = 3,
        install: bool = True) -> dict[str, Any]:
    libraries = installed_builds()
    names = builds or list(libraries)
    started = time.time()
    rows: dict[str, Any] = {}
    for name in names:
        if name not in PINS:
            raise ValueError(f"unknown build {name!r}; known: {sorted(PINS)}")
        row: dict[str, Any] = {"library": str(libraries[name]) if name in libraries else None}
        if name in libraries:
            for weights in ("auto", "f16"):
                print(f"[install] {name}: decoding SmolLM2 ({weights} weights)", flush=True)
                row[f"decode_{weights}"] = decode(libraries[name], weights, repeats)
            row["tokens_per_s"] = row["decode_auto"].get("tokens_per_s")
        if install:
            print(f"[install] {name}: installing {PINS[name]} into an empty venv", flush=True)
            row |= install_cost(name)
        rows[name] = row
    result = {"builds": rows, "repeats": repeats, "cpu_count": os.cpu_count(),
              "load_average_at_end": os.getloadavg()[0], "wall_minutes": (time.time() - started) / 60,
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    native, prebuilt = rows.get("llama-cpp-python", {}), rows.get("xllamacpp", {})
    for key in ("auto", "f16"):
        fast, ours = (native.get(f"decode_{key}") or {}).get("tokens_per_s"), \
            (prebuilt.get(f"decode_{key}") or {}).get("tokens_per_s")
        result[f"tokens_per_s_ratio_{key}"] = ours / fast if fast and ours else None
    result["tokens_per_s_ratio"] = result["tokens_per_s_ratio_auto"]
    return save_results(out_dir, "install", result, table, plot)


def table(result: dict[str, Any]) -> str:
    lines = ["# Installing llama.cpp, and what each build decodes",
             (f"SmolLM2-135M, the node's generator, 8 prompts x 8 completions, 1 thread, median of "
             f"{result['repeats']}; {result['measured_at']}, {result['wall_minutes']:.1f} min."), "",
             ("| build | install s (empty venv, no cache) | compiler | weights | tok/s | tok/CPU-s | f16 tok/s "
             "| log-prob vs torch mean / max |"), "|---|---|---|---|---|---|---|---|"]
    for name, row in result["builds"].items():
        auto, f16 = row.get("decode_auto") or {}, row.get("decode_f16") or {}
        agree = auto.get("logprob_agreement") or {}
        lines.append(f"| {name} | {row.get('install_seconds', float('nan')):.0f} | "
                     f"{'yes' if row.get('compiler_needed') else 'no'} | {auto.get('weights', '-')} | "
                     f"{auto.get('tokens_per_s', float('nan')):.0f} | {auto.get('tokens_per_cpu_s', float('nan')):.0f} | "
                     f"{f16.get('tokens_per_s', float('nan')):.0f} | "
                     f"{agree.get('mean_abs', float('nan')):.4f} / {agree.get('max_abs', float('nan')):.3f} |")
    ratio, ratio16 = result.get("tokens_per_s_ratio_auto"), result.get("tokens_per_s_ratio_f16")
    if ratio:
        lines += ["", (f"xllamacpp decodes at **{ratio:.2f}x** llama-cpp-python's own build (each in its automatic "
                  f"weights), {ratio16:.2f}x in f16 on both.")]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Decode tokens/s per build and weight type beside its install seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["builds"])
    fig, (speed, cost) = plt.subplots(1, 2, figsize=(9, 3.4))
    for offset, key in ((-0.2, "auto"), (0.2, "f16")):
        values = [(result["builds"][n].get(f"decode_{key}") or {}).get("tokens_per_s") or 0 for n in names]
        speed.bar([i + offset for i in range(len(names))], values, width=0.4, label=f"{key} weights")
    speed.set_xticks(range(len(names)), names)
    speed.set_ylabel("tokens / s (SmolLM2, 1 thread)")
    speed.legend()
    cost.bar(names, [result["builds"][n].get("install_seconds") or 0 for n in names], color="tab:gray")
    cost.set_ylabel("install seconds (empty venv)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
