"""Which x86-64 instruction-set level do the bundle's native libraries need?

    .venv/bin/python packaging/isa_check.py DIR [--baseline x86-64]   # exit 1 if a library needs more

A bundle built on one machine runs on others: llama.cpp compiled with -march=native on an AVX512-BF16
machine stops with "illegal instruction" on a CPU without AVX512. The portable build (GGML_NATIVE=OFF,
GGML_BACKEND_DL, GGML_CPU_ALL_VARIANTS) ships one CPU backend per level, `libggml-cpu-<variant>.so`,
of which ggml loads the best one the CPU supports; everything else must run on the baseline. This
check disassembles each library (binutils `objdump`) and finds the highest level its instructions
need: x86-64 (SSE2) < x86-64-v2 (SSSE3, SSE4, POPCNT) < x86-64-v3 (AVX, AVX2, FMA, F16C, BMI) <
x86-64-v4 (AVX-512). It reads instructions, not compiler flags, so it also catches a stray
-march=native in a sub-build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
BASELINE_VARIANT = "x64"  # ggml's variant built with no instruction-set flags: the fallback everywhere
_VARIANT = re.compile(r"^libggml-cpu-([a-z0-9_]+)\.so")

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_V2 = _words("""
pshufb phaddw phaddd phaddsw phsubw phsubd phsubsw pmaddubsw pmulhrsw palignr pabsb pabsw pabsd psignb psignw
psignd pblendvb blendvps blendvpd pblendw blendps blendpd dpps dppd insertps extractps pextrb pextrd pextrq pinsrb
pinsrd pinsrq pmaxsb pmaxsd pmaxud pmaxuw pminsb pminsd pminud pminuw pmovsxbw pmovsxbd pmovsxbq pmovsxwd pmovsxwq
pmovsxdq pmovzxbw pmovzxbd pmovzxbq pmovzxwd pmovzxwq pmovzxdq pmuldq pmulld ptest roundps roundpd roundss roundsd
packusdw pcmpeqq pcmpgtq pcmpestri pcmpestrm pcmpistri pcmpistrm crc32 crc32b crc32w crc32l crc32q popcnt mpsadbw
phminposuw movntdqa
""")
# tzcnt is left out: it is `rep bsf`, which CPUs without BMI run as bsf, and GCC emits it for any target
# where the two agree (a non-zero input). lzcnt has no such twin.
_V3_SCALAR = _words("andn bextr blsi blsmsk blsr lzcnt pdep pext rorx sarx shlx shrx mulx movbe")
_V4_MNEMONIC = re.compile(r"^(k(mov|and|or|xor|not|shift|test|unpck|add|ortest)|vpternlog|vpermt2|vpermi2|"
                          r"vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16ps|vpdpbusd|vpdpwssd|vpcompress|vpexpand|"
                          r"vcompress|vexpand|vpconflict|vplzcnt|vrcp14|vrsqrt14|vscalef|vgetexp|vgetmant|"
                          r"vfixupimm|vrndscale|vreduce|vrange|valign[dq]|"
                          # AVX-512 down-converts (vpmovmskb, an AVX one, is not among them)
                          r"vpmovu?s?(wb|db|qb|dw|qw|qd)\b|vpmov[bwdq]2m|vpmovm2[bwdq])")
_VMX = _words("verr verw vmcall vmlaunch vmresume vmxoff vmxon vmread vmwrite vmptrld vmptrst vmclear vmfunc")
_ZMM_OR_MASK = re.compile(r"%zmm\d|\{%k[1-7]\}|%k[0-7]\b")


def level_of(mnemonic: str, operands: str) -> int:
    """The x86-64 level (index into LEVELS) one disassembled instruction needs."""
    m = mnemonic.lower()
    if _ZMM_OR_MASK.search(operands) or _V4_MNEMONIC.match(m):
        return 3
    if m.startswith("v") and m not in _VMX:  # every VEX-encoded instruction: AVX, AVX2, FMA, F16C
        return 2
    if m in _V3_SCALAR:
        return 2
    if m in _V2:
        return 1
    return 0


@dataclass
class LibraryReport:
    name: str
    level: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # instructions per level name
    examples: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "needs": LEVELS[self.level], "counts": dict(self.counts),
                "examples": self.examples}


def scan_disassembly(name: str, lines: list[str] | object) -> LibraryReport:
    """Classify `objdump -d --no-show-raw-insn` output lines."""
    report = LibraryReport(name)
    for line in lines:  # type: ignore[attr-defined]
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip().endswith(":"):
            continue
        text = parts[1].strip()
        if not text or text.startswith("("):
            continue
        mnemonic, _, operands = text.partition(" ")
        while mnemonic in ("lock", "rep", "repz", "repnz", "repe", "repne", "notrack", "bnd", "data16") and operands:
            mnemonic, _, operands = operands.strip().partition(" ")
        level = level_of(mnemonic, operands)
        if level:
            report.counts[LEVELS[level]] += 1
            shown = report.examples.setdefault(LEVELS[level], [])
            if len(shown) < 3:
                shown.append(text[:80])
            report.level = max(report.level, level)
    return report


def scan_library(path: Path) -> LibraryReport:
    objdump = shutil.which("objdump")
    if objdump is None:
        raise RuntimeError("objdump (binutils) is needed to check instruction sets")
    proc = subprocess.Popen([objdump, "-d", "--no-show-raw-insn", str(path)], stdout=subprocess.PIPE,
                            text=True, errors="replace")
    assert proc.stdout is not None
    report = scan_disassembly(path.name, proc.stdout)
    if proc.wait() != 0:
        raise RuntimeError(f"objdump could not read {path}")
    return report


def check_dir(lib_dir: Path, baseline: str = "x86-64") -> dict[str, object]:
    """Every shared library in lib_dir: the level it needs; problems: what breaks a baseline CPU."""
    limit = LEVELS.index(baseline)
    libs, seen = [], set()
    for p in sorted(Path(lib_dir).iterdir(), key=lambda p: (len(p.name), p.name)):
        if p.is_file() and not p.is_symlink() and ".so" in p.name:
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            if digest not in seen:  # libfoo.so, .so.0 and .so.0.25.3 are often three copies of one file
                seen.add(digest)
                libs.append(p)
    problems: list[str] = []
    reports, variants = [], []
    for lib in libs:
        report = scan_library(lib)
        reports.append(report.as_dict())
        match = _VARIANT.match(lib.name)
        if match:
            variants.append(match.group(1))
        dispatched = match is not None and match.group(1) != BASELINE_VARIANT
        if not dispatched and report.level > limit:
            problems.append(f"{lib.name} needs {LEVELS[report.level]} (e.g. {report.examples[LEVELS[report.level]][0]}); "
                            f"the baseline is {baseline}")
    if variants and BASELINE_VARIANT not in variants:
        problems.append(f"CPU variants {variants} but no {BASELINE_VARIANT} fallback for baseline CPUs")
    if not libs:
        problems.append(f"no shared libraries in {lib_dir}")
    return {"dir": str(lib_dir), "baseline": baseline, "libraries": reports, "cpu_variants": variants,
            "problems": problems, "ok": not problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib_dir", type=Path)
    parser.add_argument("--baseline", choices=LEVELS, default="x86-64")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = check_dir(args.lib_dir, args.baseline)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for lib in result["libraries"]:  # type: ignore[union-attr]
            print(f"{lib['name']:40s} needs {lib['needs']}")
        for problem in result["problems"]:  # type: ignore[union-attr]
            print(f"PROBLEM: {problem}")
        print("ok: runs on any" if result["ok"] else "NOT portable to every", args.baseline, "CPU")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
