"""Colours, fonts and icons shared by the views (one place, so the tray and the header agree)."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

from engine.paths import RESOURCES_DIR

ICON_PATH = RESOURCES_DIR / "icons" / "sapo.svg"

STATE_COLORS = {
    "stopped": "#8a8f98",
    "solo": "#2563eb",
    "joining": "#d97706",
    "in_swarm": "#16a34a",
    "pausing": "#ea580c",
    "paused": "#64748b",
    "leaving": "#d97706",
    "disconnected": "#dc2626",
}
ACCENT = "#0f766e"
PLOT_COLORS = ("#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#db2777", "#65a30d",
               "#78716c")

STYLE = """
QMainWindow { background: #f6f7f9; }
QFrame#header { background: #ffffff; border-bottom: 1px solid #e3e6ea; }
QLabel#title { font-size: 18px; font-weight: 600; color: #111827; }
QLabel#subtitle { color: #6b7280; }
QLabel#stateLabel { font-size: 17px; font-weight: 600; }
QLabel#stateDetail { color: #6b7280; }
QLabel[role="stat"] { color: #374151; }
QLabel[role="statValue"] { color: #111827; font-weight: 600; }
QFrame[role="card"] { background: #ffffff; border: 1px solid #e3e6ea; border-radius: 8px; }
QLabel[role="cardValue"] { font-size: 20px; font-weight: 600; color: #111827; border: none; }
QLabel[role="cardName"] { color: #6b7280; border: none; }
QLabel[role="hint"] { color: #6b7280; }
QLabel[role="error"] { color: #b91c1c; }
QPushButton#joinButton { font-size: 16px; font-weight: 600; color: white; border-radius: 8px;
    padding: 10px 22px; background: #16a34a; border: none; min-width: 170px; }
QPushButton#joinButton:hover { background: #15803d; }
QPushButton#joinButton[leave="true"] { background: #b91c1c; }
QPushButton#joinButton[leave="true"]:hover { background: #991b1b; }
QPushButton#joinButton:disabled { background: #9ca3af; }
QTabWidget::pane { border: none; }
QTableView { background: #ffffff; alternate-background-color: #f9fafb; gridline-color: #eef0f3; }
"""


def task_name(specialty: str) -> str:
    """A task family's name as a contributor reads it: "basic arithmetic", not "basic_arithmetic"."""
    return specialty.replace("_", " ")


def apply_style(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = app.palette()
    palette.setColor(QPalette.ColorRole.Window, QColor("#f6f7f9"))
    palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.AlternateBase, QColor("#f9fafb"))
    palette.setColor(QPalette.ColorRole.Highlight, QColor(ACCENT))
    app.setPalette(palette)
    app.setStyleSheet(STYLE)
    font = app.font()
    font.setPointSizeF(max(font.pointSizeF(), 10.0))
    app.setFont(font)


def app_icon() -> QIcon:
    return QIcon(str(ICON_PATH)) if ICON_PATH.exists() else state_icon("in_swarm")


def state_icon(state: str, size: int = 64) -> QIcon:
    """The app icon with a badge in the state's colour (tray icon)."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    if ICON_PATH.exists():
        QIcon(str(ICON_PATH)).paint(painter, 0, 0, size, size)
    badge = size * 0.42
    rect = QRectF(size - badge - 1, size - badge - 1, badge, badge)
    painter.setPen(QColor("#ffffff"))
    painter.setBrush(QColor(STATE_COLORS.get(state, STATE_COLORS["disconnected"])))
    painter.drawEllipse(rect)
    painter.end()
    return QIcon(pixmap)


def dot(color: str, size: int = 14) -> QPixmap:
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(color))
    painter.drawEllipse(1, 1, size - 2, size - 2)
    painter.end()
    return pixmap


def bold(font: QFont, size: float | None = None) -> QFont:
    font = QFont(font)
    font.setBold(True)
    if size:
        font.setPointSizeF(size)
    return font
