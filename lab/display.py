"""A private X server for real windows in the lab (the walk-through, the screenshot scripts): Xvfb picks
a free display and says which, so two runs never share one."""

from __future__ import annotations

import subprocess


def start_xvfb(width: int, height: int) -> tuple[subprocess.Popen[bytes], str]:
    """Xvfb at `width` x `height` -> (its process, the display name such as ":3")."""
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert xvfb.stdout is not None
    display = xvfb.stdout.readline().decode().strip()
    if not display.isdigit():
        xvfb.kill()
        xvfb.wait(5)
        raise RuntimeError("Xvfb did not report a display")
    return xvfb, f":{display}"
