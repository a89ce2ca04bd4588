"""The engine's native heap: what it holds, and giving freed pages back to the system.

A node trains for days. Each round allocates and frees tensors of the same few sizes from several
threads (trainer, asyncio loop, re-scoring); glibc keeps freed chunks in per-thread arenas and only
returns the top of each heap on its own, so the resident set creeps up in steps while the bytes in
use stay flat (the soak measured ~2 MiB/h). `malloc_trim(0)` hands free pages inside every arena
back (madvise), which bounds that. Elsewhere (macOS, Windows, musl) both calls are no-ops.

A trim can only give back whole free pages, and the 2-hour soak still grew ~6 MiB/h with the malloc
heap's free-but-held bytes rising as fast as the resident set: fragmentation. Two glibc settings
(`configure_allocator`) address its two usual causes in a threaded PyTorch process: one arena per
thread that ever allocated (each fragments on its own), and the dynamic mmap threshold, which after
the first large free sends every later tensor of up to 32 MiB into the arenas, where its holes stay.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from dataclasses import dataclass
from typing import Any

MIB = 2**20


@dataclass(frozen=True)
class MemoryConfig:
    """How the engine keeps its native heap small."""

    trim_every_s: float = 60.0  # seconds between heap trims after a round; 0 = never trim
    arena_max: int = 2  # most malloc arenas the threads share (glibc's M_ARENA_MAX); 0 = glibc's 8 per core
    # Allocations from this size up are mmapped and unmapped on free (M_MMAP_THRESHOLD, which also turns
    # off glibc's dynamic threshold); 0 = glibc's dynamic threshold.
    mmap_threshold_kib: int = 256

    def __post_init__(self) -> None:
        value = self.trim_every_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400:
            raise ValueError("trim_every_s must be a number of seconds in [0, 86400]")
        for name, high in (("arena_max", 1024), ("mmap_threshold_kib", 32 * 1024)):  # glibc's own maximum
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
                raise ValueError(f"{name} must be an int in [0, {high}], got {value!r}")


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33, struct mallinfo2: every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _load_libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallinfo2"):
        return None  # not glibc, or one older than 2.33
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


_LIBC = _load_libc()


def heap_stats() -> dict[str, float] | None:
    """The malloc heap over all arenas, in MiB: bytes in use, free but held, and mmapped; None off glibc."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return {"in_use_mib": round(info.uordblks / MIB, 2), "free_held_mib": round(info.fordblks / MIB, 2),
            "mmapped_mib": round(info.hblkhd / MIB, 2)}


_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's malloc.h


def configure_allocator(config: MemoryConfig) -> dict[str, int]:
    """Apply the arena cap and the fixed mmap threshold (process-wide; before threads start is best, as
    arenas already made stay). Returns what was set; empty off glibc or with both at 0."""
    applied: dict[str, int] = {}
    if _LIBC is None:
        return applied
    if config.arena_max and _LIBC.mallopt(_M_ARENA_MAX, config.arena_max) == 1:
        applied["arena_max"] = config.arena_max
    if config.mmap_threshold_kib and _LIBC.mallopt(_M_MMAP_THRESHOLD, config.mmap_threshold_kib * 1024) == 1:
        applied["mmap_threshold_kib"] = config.mmap_threshold_kib
    return applied


def trim_heap() -> bool:
    """Give the free pages of every arena back to the system; True when some were."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False


class HeapTrimmer:
    """Trims the heap after a round at most every `trim_every_s` (called from the training thread)."""

    def __init__(self, config: MemoryConfig, clock: Any = time.monotonic) -> None:
        self.config = config
        self.allocator = configure_allocator(config)
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()
        self.trims = 0
        self.released = 0  # trims that gave pages back

    def after_round(self) -> bool:
        """Trim when due; True when a trim ran."""
        if not self.config.trim_every_s or _LIBC is None:
            return False
        now = self._clock()
        if now - self._last < self.config.trim_every_s:
            return False
        self._last = now
        released = trim_heap()
        with self._lock:
            self.trims += 1
            self.released += released
        return True

    def status(self) -> dict[str, Any]:
        with self._lock:
            trims, released = self.trims, self.released
        return {"heap": heap_stats(), "trims": trims, "trims_released": released,
                "trim_every_s": self.config.trim_every_s, "allocator": dict(self.allocator)}
