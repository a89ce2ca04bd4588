"""What machine is this: CUDA GPUs, Apple MPS, CPU and RAM, battery, user idle time, temperature.

Every probe answers honestly: a value, or None meaning "unknown on this OS / this machine". Nothing
here raises for a missing sensor. torch is imported lazily: `probe()` costs a torch import, the
`Cpu`/battery/idle probes do not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import re
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

GIB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int | None  # None where the driver can't say
    compute_capability: tuple[int, int] | None = None  # CUDA only

    @property
    def bf16(self) -> bool:
        return self.compute_capability is not None and self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class CpuInfo:
    name: str
    physical_cores: int
    logical_cores: int
    ram_total_bytes: int
    ram_available_bytes: int


@dataclass(frozen=True)
class Battery:
    present: bool | None  # None: the OS doesn't say
    percent: float | None = None
    plugged_in: bool | None = None


@dataclass(frozen=True)
class HardwareProfile:
    """One machine. `kind` is the accelerator training would use: "cuda", "mps" or "cpu"."""

    kind: str
    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...] = ()
    # MPS: the budget Metal allows one process (recommendedMaxWorkingSetSize), not all unified memory.
    mps_budget_bytes: int | None = None
    battery: Battery = field(default_factory=lambda: Battery(present=None))
    idle_seconds: float | None = None
    os: str = field(default_factory=lambda: f"{platform.system()} {platform.release()}")

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "mps", "cpu"):
            raise ValueError(f"unknown device kind {self.kind!r}")

    @property
    def device_name(self) -> str:
        if self.kind == "cuda" and self.gpus:
            return self.gpus[0].name
        if self.kind == "mps":
            return f"Apple GPU (MPS), {self.cpu.name}"
        return self.cpu.name

    @property
    def accelerator_budget_bytes(self) -> int:
        """Memory a training process may use on its compute device."""
        if self.kind == "cuda" and self.gpus:
            gpu = self.gpus[0]
            return gpu.free_bytes if gpu.free_bytes is not None else gpu.total_bytes
        if self.kind == "mps":
            return self.mps_budget_bytes or mps_default_budget(self.cpu.ram_total_bytes)
        return self.cpu.ram_available_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["name"] = self.device_name
        data["budget_bytes"] = self.accelerator_budget_bytes
        data["temperature_c"] = max_temperature_c()
        data["temperature_sensors"] = data["temperature_c"] is not None  # the GUI's temperature cap
        return data


def mps_default_budget(unified_bytes: int) -> int:
    """Metal's recommended working set when torch can't tell us: ~2/3 of RAM up to 36 GB, ~3/4 above."""
    return int(unified_bytes * (0.75 if unified_bytes > 36 * GIB else 2 / 3))


def cpu_info() -> CpuInfo:
    vm = psutil.virtual_memory()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return CpuInfo(name=_cpu_name(), physical_cores=physical, logical_cores=logical,
                   ram_total_bytes=vm.total, ram_available_bytes=vm.available)


def _cpu_name() -> str:
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
    if sys.platform == "darwin":
        out = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if out:
            return out
    return platform.processor() or platform.machine() or "CPU"


def torch_cpu_bf16() -> bool:
    """Whether torch runs bf16 matmuls natively on this CPU (oneDNN with AVX512-BF16 or AMX); elsewhere
    bf16 is emulated and slower than fp32."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def battery() -> Battery:
    """psutil says None both for "no battery" and "can't tell"; on Linux we can tell them apart."""
    try:
        info = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):
        info = None
    if info is not None:
        plugged = info.power_plugged
        return Battery(present=True, percent=float(info.percent), plugged_in=plugged)
    supplies = Path("/sys/class/power_supply")
    if sys.platform.startswith("linux") and supplies.is_dir():
        types = {_read(p / "type") for p in supplies.iterdir()}
        return Battery(present="Battery" in types)
    return Battery(present=None)


def idle_seconds() -> float | None:
    """Seconds since the user's last keyboard/mouse input, or None where the OS won't say."""
    try:
        if sys.platform == "win32":
            return _idle_windows()
        if sys.platform == "darwin":
            out = _run(["ioreg", "-c", "IOHIDSystem", "-d", "4"])
            match = re.search(r'"HIDIdleTime"\s*=\s*(\d+)', out or "")
            return int(match.group(1)) / 1e9 if match else None
        if os.environ.get("DISPLAY"):
            return _idle_x11()
    except (OSError, ValueError):
        return None
    return None  # Wayland and consoles offer no portable idle query


def _idle_windows() -> float | None:
    class LastInputInfo(ctypes.Structure):
        _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

    info = LastInputInfo()
    info.cbSize = ctypes.sizeof(info)
    windll = ctypes.windll  # type: ignore[attr-defined]
    if not windll.user32.GetLastInputInfo(ctypes.byref(info)):
        return None
    return (windll.kernel32.GetTickCount() - info.dwTime) / 1000.0


# Xlib is not thread-safe unless XInitThreads ran first; every node worker (and a GUI sharing the
# process) may probe idle time at once, which corrupted the heap ("malloc(): unaligned tcache chunk").
_XLIB_LOCK = threading.Lock()


def _idle_x11() -> float | None:
    with _XLIB_LOCK:
        return _idle_x11_locked()


class _XScreenSaverInfo(ctypes.Structure):
    _fields_ = [("window", ctypes.c_ulong), ("state", ctypes.c_int), ("kind", ctypes.c_int),
                ("til_or_since", ctypes.c_ulong), ("idle", ctypes.c_ulong), ("eventMask", ctypes.c_ulong)]


@functools.cache
def _x11_libraries() -> tuple[Any, Any] | None:
    """libX11 and libXss, found once: find_library runs `ldconfig -p`, too slow for once a round."""
    xlib_name, xss_name = ctypes.util.find_library("X11"), ctypes.util.find_library("Xss")
    if not xlib_name or not xss_name:
        return None
    return ctypes.cdll.LoadLibrary(xlib_name), ctypes.cdll.LoadLibrary(xss_name)


def _idle_x11_locked() -> float | None:
    libraries = _x11_libraries()
    if libraries is None:
        return None
    xlib, xss = libraries
    xlib.XOpenDisplay.restype = ctypes.c_void_p
    display = xlib.XOpenDisplay(None)
    if not display:
        return None
    try:
        xlib.XDefaultRootWindow.restype = ctypes.c_ulong
        root = xlib.XDefaultRootWindow(ctypes.c_void_p(display))
        xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(_XScreenSaverInfo)
        info = xss.XScreenSaverAllocInfo()
        if not info:
            return None
        try:
            if not xss.XScreenSaverQueryInfo(ctypes.c_void_p(display), ctypes.c_ulong(root), info):
                return None
            return float(info.contents.idle) / 1000.0
        finally:
            xlib.XFree(info)  # allocated by Xss on every probe (once a round): never leak it
    finally:
        xlib.XCloseDisplay(ctypes.c_void_p(display))


def max_temperature_c() -> float | None:
    """The hottest CPU/GPU sensor psutil can read, or None."""
    try:
        temps = psutil.sensors_temperatures()  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None
    readings = [t.current for entries in temps.values() for t in entries if t.current and t.current > 0]
    return max(readings) if readings else None


def probe(prefer: str | None = None) -> HardwareProfile:
    """Detect this machine. `prefer` ("cuda"/"mps"/"cpu") restricts the choice, e.g. GPU off."""
    import torch

    cpu = cpu_info()
    gpus: list[GpuInfo] = []
    if prefer in (None, "cuda") and torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            try:
                free, _total = torch.cuda.mem_get_info(index)
            except RuntimeError:
                free = None
            gpus.append(GpuInfo(index=index, name=props.name, total_bytes=int(props.total_memory),
                                free_bytes=free, compute_capability=(props.major, props.minor)))
    kind, mps_budget = "cpu", None
    if gpus:
        kind = "cuda"
    elif prefer in (None, "mps") and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        kind = "mps"
        try:
            mps_budget = int(torch.mps.recommended_max_memory())
        except (AttributeError, RuntimeError):
            mps_budget = mps_default_budget(cpu.ram_total_bytes)
    return HardwareProfile(kind=kind, cpu=cpu, gpus=tuple(gpus), mps_budget_bytes=mps_budget,
                           battery=battery(), idle_seconds=idle_seconds())


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
