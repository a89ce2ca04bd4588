"""The pinned Qt binding keeps Python's books straight: PySide6 6.12.0 under Python 3.11 dropped a
reference to None on every void call and the app aborted (none_dealloc) within seconds of painting."""

from __future__ import annotations

import sys

from PySide6.QtGui import QColor, QImage, QPainter, QPen


def test_void_qt_calls_do_not_leak_references_to_none() -> None:
    image = QImage(32, 32, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        before = sys.getrefcount(None)
        for _ in range(5000):
            painter.setPen(QPen(QColor("red")))
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.save()
            painter.restore()
        drift = sys.getrefcount(None) - before
    finally:
        painter.end()
    assert drift > -100, f"None lost {-drift} references in 20,000 void calls: a broken Qt binding"
