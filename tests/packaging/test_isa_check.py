"""The bundle's instruction-set check: hand-written disassembly, then real shared libraries compiled
here for a chosen level (compiling for AVX2 or AVX-512 needs no such CPU, so this runs anywhere)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))
import isa_check

AVX2_SOURCE = """
#include <immintrin.h>
void add8(float *a, const float *b) { _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b))); }
"""
AVX512_SOURCE = """
#include <immintrin.h>
void add16(float *a, const float *b) { _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b))); }
"""
PLAIN_SOURCE = "int count(const char *s) { int n = 0; while (s[n]) n++; return n; }\n"


def test_levels_of_hand_written_instructions() -> None:
    lines = ["  1000:\tmov    %rdi,%rax", "  1003:\tpaddd  %xmm1,%xmm0", "  1007:\tpshufb %xmm1,%xmm0",
             "  100c:\tvfmadd231ps %ymm2,%ymm1,%ymm0", "  1011:\tvaddps %zmm1,%zmm2,%zmm3{%k1}",
             "  1017:\ttzcnt  %rax,%rcx", "  1019:\tvpmovmskb %xmm3,%edx", "  101a:\tvpmovdb %zmm1,%xmm2", "  101b:\tlock cmpxchg %rdx,(%rdi)", "  101f:\tvmcall",
             "0000000000001000 <f>:", "  1022:\t(bad)"]
    report = isa_check.scan_disassembly("x", lines)
    assert isa_check.LEVELS[report.level] == "x86-64-v4"
    assert report.counts == {"x86-64-v2": 1, "x86-64-v3": 2, "x86-64-v4": 2}
    assert isa_check.scan_disassembly("y", lines[:2] + [lines[5], lines[8], lines[9]]).level == 0  # tzcnt: bsf anywhere
    assert isa_check.LEVELS[isa_check.scan_disassembly("z", [lines[6]]).level] == "x86-64-v3"  # vpmovmskb: AVX


def _shared(tmp: Path, name: str, source: str, *flags: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp / f"{name}.c").write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", *flags, str(tmp / f"{name}.c"), "-o", str(out)], check=True,
                   capture_output=True)
    return out


def test_real_libraries_are_flagged_by_what_they_were_compiled_for(tmp_path: Path) -> None:
    if shutil.which("objdump") is None:
        pytest.skip("binutils not installed")
    plain = isa_check.scan_library(_shared(tmp_path, "plain", PLAIN_SOURCE, "-march=x86-64"))
    avx2 = isa_check.scan_library(_shared(tmp_path, "avx2", AVX2_SOURCE, "-mavx2"))
    avx512 = isa_check.scan_library(_shared(tmp_path, "avx512", AVX512_SOURCE, "-mavx512f"))
    assert [isa_check.LEVELS[r.level] for r in (plain, avx2, avx512)] == ["x86-64", "x86-64-v3", "x86-64-v4"]


def test_a_bundle_dir_passes_only_with_dispatched_variants_and_a_baseline_fallback(tmp_path: Path) -> None:
    if shutil.which("objdump") is None:
        pytest.skip("binutils not installed")
    build, lib = tmp_path / "build", tmp_path / "lib"
    build.mkdir()
    lib.mkdir()
    shutil.copy(_shared(build, "plain", PLAIN_SOURCE, "-march=x86-64"), lib / "libggml-base.so")
    shutil.copy(_shared(build, "v4", AVX512_SOURCE, "-mavx512f"), lib / "libggml-cpu-skylakex.so")
    result = isa_check.check_dir(lib)
    assert not result["ok"] and "no x64 fallback" in result["problems"][0]
    shutil.copy(_shared(build, "x64", PLAIN_SOURCE + "int x64(void) { return 1; }\n", "-march=x86-64"),
                lib / "libggml-cpu-x64.so")
    result = isa_check.check_dir(lib)
    assert result["ok"] and sorted(result["cpu_variants"]) == ["skylakex", "x64"], result["problems"]
    shutil.copy(_shared(build, "native", AVX2_SOURCE, "-mavx2"), lib / "libllama.so")  # a -march=native leftover
    result = isa_check.check_dir(lib)
    assert not result["ok"] and result["problems"][0].startswith("libllama.so needs x86-64-v3")
    assert isa_check.main([str(lib)]) == 1
