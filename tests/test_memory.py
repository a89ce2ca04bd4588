"""The native heap trimmer: config validation, its schedule, and glibc's own figures where present."""

from __future__ import annotations

import math
import os

import pytest

from engine.machine import memory
from engine.machine.memory import HeapTrimmer, MemoryConfig


@pytest.mark.parametrize("bad", [-1, 86401, True, "60", float("nan")])
def test_config_refuses_bad_intervals(bad: object) -> None:
    with pytest.raises(ValueError):
        MemoryConfig(trim_every_s=bad)  # type: ignore[arg-type]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.skipif(memory.heap_stats() is None, reason="needs glibc >= 2.33")
def test_trims_at_most_once_per_interval() -> None:
    clock = FakeClock()
    trimmer = HeapTrimmer(MemoryConfig(trim_every_s=60), clock=clock)
    clock.now = 59.0
    assert not trimmer.after_round()
    clock.now = 60.0
    assert trimmer.after_round()
    clock.now = 100.0
    assert not trimmer.after_round()
    clock.now = 121.0
    assert trimmer.after_round()
    assert trimmer.status()["trims"] == 2


def test_zero_interval_never_trims() -> None:
    clock = FakeClock()
    trimmer = HeapTrimmer(MemoryConfig(trim_every_s=0), clock=clock)
    clock.now = 1e6
    assert not trimmer.after_round()
    assert trimmer.status()["trims"] == 0


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(memory.heap_stats() is None, reason="needs glibc >= 2.33")
def test_a_trim_gives_freed_pages_back() -> None:
    # 64 KiB blocks come from the heap (below the mmap threshold); freeing every other one leaves
    # holes glibc cannot return by shrinking the heap's top. A trim hands their pages back, and the
    # bytes in use stay what they were.
    blocks = [bytearray(b"x" * 65536) for _ in range(3000)]
    kept = blocks[1::2]
    del blocks
    before_rss, before = _rss_mib(), memory.heap_stats()
    assert before is not None and all(math.isfinite(v) and v >= 0 for v in before.values())
    assert memory.trim_heap()
    after_rss, after = _rss_mib(), memory.heap_stats()
    assert after is not None
    assert before_rss - after_rss > 50, (before_rss, after_rss)
    assert after["in_use_mib"] == pytest.approx(before["in_use_mib"], abs=1.0)
    assert len(kept) == 1500


@pytest.mark.parametrize("bad", [{"arena_max": -1}, {"arena_max": True}, {"mmap_threshold_kib": 1 << 20},
                                 {"mmap_threshold_kib": 1.5}])
def test_allocator_settings_are_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        MemoryConfig(**bad)


_PROBE = """
import json, sys
from engine.machine import memory
if sys.argv[1] == "fixed":
    assert memory.configure_allocator(memory.MemoryConfig()) == {"arena_max": 2, "mmap_threshold_kib": 256}
big = bytearray(8 << 20)  # mmapped, then freed: glibc's dynamic threshold rises to 8 MiB
del big
before = memory.heap_stats()["mmapped_mib"]
tensor_sized = bytearray(1 << 20)
print(json.dumps(memory.heap_stats()["mmapped_mib"] - before))
"""


@pytest.mark.skipif(memory.heap_stats() is None, reason="needs glibc >= 2.33")
def test_a_fixed_mmap_threshold_keeps_large_blocks_out_of_the_arenas() -> None:
    # In a fresh interpreter (the settings are process-wide): after one large block was freed, glibc's
    # own threshold puts a 1 MiB block in an arena, where its hole stays after it is freed; with the
    # fixed threshold it is mapped on its own and unmapped on free.
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def mapped(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=env,
                             check=True, timeout=60)
        return float(json.loads(out.stdout))

    assert mapped("fixed") >= 1.0
    assert mapped("dynamic") < 0.5
