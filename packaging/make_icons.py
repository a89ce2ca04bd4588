"""Render the app icon (resources/icons/sapo.svg) into every format the desktop bundles need.

    .venv/bin/python packaging/make_icons.py    # rewrites packaging/icons/

Linux wants PNGs per hicolor size (plus the SVG), Windows an .ico, macOS an .icns. Both containers
hold PNG images, so they are written here directly (Qt's ICNS plugin is not in PySide6-Essentials).
The outputs are committed: a build needs no display and no renderer.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "icons" / "sapo.svg"
OUT = Path(__file__).resolve().parent / "icons"
NAME = "sapo-swarm"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)  # the hicolor sizes desktops look for
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # 256 is the largest an .ico entry can declare
# ICNS element types holding PNG data, by pixel size (Apple's "ic07".."ic10"; 32/64 as retina types)
ICNS_TYPES = ((b"icp4", 16), (b"icp5", 32), (b"icp6", 64), (b"ic07", 128), (b"ic08", 256),
              (b"ic09", 512), (b"ic10", 1024))


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICO file whose entries are PNG images (supported since Windows Vista)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))  # reserved, type 1 = icon, count
    offset = 6 + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        data = pngs[size]
        dim = 0 if size >= 256 else size  # 0 means 256 in the directory entry
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(data), offset)
        offset += len(data)
        blobs += data
    return header + entries + blobs


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICNS file: 'icns' + total length, then (type, length incl. 8-byte header, PNG) elements."""
    body = b"".join(kind + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
                    for kind, size in ICNS_TYPES if size in pngs)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def render(svg: Path, sizes: tuple[int, ...]) -> dict[int, bytes]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"cannot render {svg}")
    out: dict[int, bytes] = {}
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stubs say bytes; PySide wants str
        out[size] = bytes(data.data())
    return out


def main() -> int:
    pngs = render(SVG, tuple(sorted(set(PNG_SIZES) | {1024})))
    OUT.mkdir(parents=True, exist_ok=True)
    for size in PNG_SIZES:
        (OUT / f"{NAME}-{size}.png").write_bytes(pngs[size])
    (OUT / f"{NAME}.ico").write_bytes(ico_bytes({s: pngs[s] for s in ICO_SIZES}))
    (OUT / f"{NAME}.icns").write_bytes(icns_bytes(pngs))
    print(f"wrote {len(PNG_SIZES)} PNGs, {NAME}.ico and {NAME}.icns to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
