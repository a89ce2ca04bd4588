from __future__ import annotations

import pytest

from engine.machine import hardware
from engine.machine.hardware import GIB


def test_probe_reports_this_machine_honestly() -> None:
    hw = hardware.probe()
    assert hw.kind in ("cuda", "mps", "cpu")
    assert hw.cpu.logical_cores >= hw.cpu.physical_cores >= 1
    assert 0 < hw.cpu.ram_available_bytes <= hw.cpu.ram_total_bytes
    assert hw.accelerator_budget_bytes > 0
    assert hw.battery.present in (True, False, None)
    assert hw.idle_seconds is None or hw.idle_seconds >= 0


def test_prefer_cpu_never_reports_a_gpu() -> None:
    hw = hardware.probe(prefer="cpu")
    assert hw.kind == "cpu" and hw.gpus == ()


def test_mps_budget_is_less_than_unified_memory() -> None:
    assert hardware.mps_default_budget(8 * GIB) == int(8 * GIB * 2 / 3)
    assert hardware.mps_default_budget(64 * GIB) == int(64 * GIB * 0.75)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        hardware.HardwareProfile(kind="tpu", cpu=hardware.cpu_info())


def test_cuda_budget_uses_free_memory() -> None:
    gpu = hardware.GpuInfo(0, "x", 24 * GIB, 20 * GIB, (8, 9))
    hw = hardware.HardwareProfile(kind="cuda", cpu=hardware.cpu_info(), gpus=(gpu,))
    assert hw.accelerator_budget_bytes == 20 * GIB and gpu.bf16
