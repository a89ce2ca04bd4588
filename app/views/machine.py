"""Machine: the device, its memory budget, the model pick and its fit verdict; switching models."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.history import finite_number
from app.views.giving import GivingBox
from engine.events import ModelProgress

CANDIDATE_COLUMNS = ("Model", "Backend", "Parameters", "Memory needed", "Verdict", "Seconds / round", "Available")
SWITCH_HINT = "Pause or leave the swarm to switch models."
VERDICT_COLORS = {"fits well": "#15803d", "fits": "#65a30d", "tight": "#d97706"}


AVAILABILITY_TIPS = {
    "installed": "On this machine: it can train now.",
    "downloadable": "Not on this machine yet; the model hub answers, so switching to it downloads it.",
    "not installed (no model hub reachable)": "Not on this machine, and the model hub does not answer from here "
                                              "(no network, a firewall, or a proxy): it cannot be fetched now.",
    "not installed (downloads are off)": "Not on this machine, and downloads are switched off "
                                         "(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE).",
    "not installed": "Not on this machine and no download source is known for it.",
}


def availability_text(cand: dict[str, Any]) -> str:
    """The Available column: what the engine says (older engines only say yes / no)."""
    text = cand.get("availability")
    if isinstance(text, str) and text in AVAILABILITY_TIPS:
        return text
    return "yes" if cand.get("available") is True else "no"


def human_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return "–"


def short_model_name(model: str) -> str:
    """A catalog id as it is; a model directory by its folder name (a full path is too long to show)."""
    return model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1][:40]


def progress_text(progress: ModelProgress) -> str:
    """One line per phase; the same words as the reply to the switch call, whichever lands last."""
    name = short_model_name(progress.model_id)
    if progress.phase == "download":
        share = f" {100 * min(1.0, progress.done / progress.total):.0f}%" if progress.total > 0 else ""
        return f"Downloading {name}{share}" + (f" ({progress.message})" if progress.message else "")
    if progress.phase in ("load", "convert"):
        return f"{'Loading' if progress.phase == 'load' else 'Converting'} {name}…"
    if progress.phase == "ready":
        return f"Switched to {name}: the next round trains it."
    return f"Could not switch to {name}: {progress.message or progress.phase}"


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)[:300]


MEASURED_ROUNDS = 20  # newest rounds the measured round time is the median of


def round_estimate_text(lent: Any, every_core_s: Any) -> str | None:
    """`sapo doctor`'s round time for the cores the contributor lends (and beside today's load), else for
    every core."""
    lent_s, threads, now_s = _get(lent, "round_seconds"), _get(lent, "threads"), _get(lent, "round_seconds_now")
    if not finite_number(lent_s):
        return f"~{every_core_s:,.0f} s per round" if finite_number(every_core_s) else None
    text = f"~{lent_s:,.0f} s per round on the {threads} core{'s' if threads != 1 else ''} you lend"
    if finite_number(now_s) and abs(now_s - lent_s) >= 1:
        text += f" (~{now_s:,.0f} s beside what else runs now)"
    if _get(lent, "source") == "measured":
        text += ", from this machine's own rounds"
    elif _get(lent, "source") == "probed":
        text += ", from a short probe of this machine (no rounds measured here yet)"
    elif _get(lent, "source") == "estimated":
        text += ", estimated (no rounds measured here yet)"
    return text


def measured_text(round_seconds: Sequence[float]) -> str:
    newest = [float(s) for s in round_seconds[-MEASURED_ROUNDS:] if s >= 0]  # a slice: the ring holds thousands
    if not newest:
        return "no round yet"
    return f"{statistics.median(newest):,.0f} s per round (median of the last {len(newest)} here)"


class MachineView(QWidget):
    refresh_requested = Signal()
    switch_requested = Signal(str)  # catalog model id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        top = QHBoxLayout()
        device_box = QGroupBox("This machine")
        self.device_form = QFormLayout(device_box)
        pick_box = QGroupBox("Model")
        self.pick_form = QFormLayout(pick_box)
        self.labels: dict[str, QLabel] = {}
        for form, keys in ((self.device_form, ("Device", "Processor", "Memory", "Memory budget", "GPU", "Battery",
                                             "Fast paths")),
                           (self.pick_form, ("Model", "Backend", "Memory needed", "Verdict", "Round time", "Measured",
                                            "Why"))):
            for key in keys:
                label = QLabel("–")
                label.setWordWrap(True)
                label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
                self.labels[f"{form is self.pick_form}:{key}"] = label
                form.addRow(f"{key}:", label)
        self.giving = GivingBox()
        top.addWidget(device_box, 1)
        top.addWidget(pick_box, 1)
        top.addWidget(self.giving, 1)
        layout.addLayout(top)

        self.table = QTableWidget(0, len(CANDIDATE_COLUMNS))
        self.table.setHorizontalHeaderLabels(CANDIDATE_COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(QLabel("Models this machine could train (estimated memory includes training):"))
        layout.addWidget(self.table, 1)

        actions = QHBoxLayout()
        self.switch_button = QPushButton("Switch to the selected model")
        self.switch_button.clicked.connect(self._switch)
        self.refresh_button = QPushButton("Check again")
        self.refresh_button.clicked.connect(self.refresh_requested)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.progress_label = QLabel()
        self.progress_label.setProperty("role", "hint")
        self.progress_label.setWordWrap(True)  # errors can be long: wrap, never widen the window
        actions.addWidget(self.switch_button)
        actions.addWidget(self.refresh_button)
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.progress_label, 2)
        layout.addLayout(actions)
        self._progress_seen: ModelProgress | None = None
        self._switching = False  # a switch is downloading / loading
        self._switch_allowed = True  # the node is stopped or paused (it refuses a switch otherwise)
        self._current = ""  # the model the node trains (its status "model"), marked in the table

    def _label(self, pick: bool, key: str, value: Any) -> None:
        self.labels[f"{pick}:{key}"].setText(_text(value))

    def show_machine(self, machine: dict[str, Any]) -> None:
        device = _get(machine, "device") or {}
        cpu = _get(device, "cpu") or {}
        gpus = _get(device, "gpus") or []
        self._label(False, "Device", f"{_text(_get(device, 'kind')).upper()} · {_text(_get(device, 'name'))}")
        self._label(False, "Processor", f"{_text(_get(cpu, 'name'))}, {_text(_get(cpu, 'physical_cores'))} cores")
        self._label(False, "Memory", human_bytes(_get(cpu, "ram_total_bytes")))
        self._label(False, "Memory budget", human_bytes(_get(device, "budget_bytes")))
        gpu_names = [str(_get(g, "name")) for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
        self._label(False, "GPU", ", ".join(gpu_names) or "none")
        battery = _get(device, "battery") or {}
        self._label(False, "Battery", "none" if not _get(battery, "present") else
                    f"{_text(_get(battery, 'percent'))}%, {'plugged in' if _get(battery, 'plugged_in') else 'on battery'}")
        self._label(False, "Fast paths", fast_paths_text(_get(machine, "fast_paths")))
        pick = _get(machine, "pick") or {}
        self._label(True, "Model", _get(pick, "model"))
        self._label(True, "Backend", " ".join(str(v) for v in (_get(pick, "backend"), _get(pick, "quantization")) if v))
        self._label(True, "Memory needed", f"{human_bytes(_get(pick, 'estimated_bytes'))} of "
                    f"{human_bytes(_get(pick, 'budget_bytes'))}")
        verdict = _text(_get(pick, "verdict"))
        self.labels["True:Verdict"].setText(f"<b style='color:{VERDICT_COLORS.get(verdict, '#b91c1c')}'>{verdict}</b>")
        self._label(True, "Round time", round_estimate_text(_get(machine, "lent") or {}, _get(pick, "round_seconds")))
        self._label(True, "Why", _get(pick, "reason") or "")
        candidates = [c for c in (_get(machine, "candidates") or []) if isinstance(c, dict)][:200]
        self.table.setRowCount(len(candidates))
        for i, cand in enumerate(candidates):
            rs = _get(cand, "round_seconds")
            values = (cand.get("model"), " ".join(str(v) for v in (cand.get("backend"), cand.get("quantization")) if v),
                      cand.get("params"), human_bytes(cand.get("estimated_bytes")), cand.get("verdict"),
                      f"{rs:,.0f}" if isinstance(rs, (int, float)) else None, availability_text(cand))
            for col, value in enumerate(values):
                item = QTableWidgetItem(_text(value))
                if col == 4 and isinstance(value, str):
                    item.setForeground(Qt.GlobalColor.darkGreen if value in VERDICT_COLORS else Qt.GlobalColor.darkRed)
                if col == 6:
                    item.setForeground(QColor("#15803d" if value == "installed" else
                                              "#111827" if value == "downloadable" else "#6b7280"))
                    item.setToolTip(AVAILABILITY_TIPS.get(str(value), ""))
                self.table.setItem(i, col, item)
        self._mark_current()

    def show_measured(self, round_seconds: Sequence[float]) -> None:
        """Beside the estimate, what rounds here took: the median of the newest (the dashboard's)."""
        self._label(True, "Measured", measured_text(round_seconds))

    def set_current_model(self, model: str, switch_allowed: bool) -> None:
        """Mark the row of the model the node trains; the switch button works while stopped or paused."""
        name = short_model_name(model)
        if name != self._current:
            self._current = name
            self._mark_current()
        if switch_allowed != self._switch_allowed:
            self._switch_allowed = switch_allowed
            self._update_switch_button()

    def _mark_current(self) -> None:
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is None:
                continue
            current = item.text() == self._current
            font = item.font()
            if font.bold() != current:
                font.setBold(current)
                item.setFont(font)
            item.setToolTip("the model this node trains" if current else "")

    def _update_switch_button(self) -> None:
        self.switch_button.setEnabled(self._switch_allowed and not self._switching)
        self.switch_button.setToolTip("" if self._switch_allowed else SWITCH_HINT)
        if self.progress_label.text() in ("", SWITCH_HINT):  # a switch's result stays until the next one
            self.show_message("")

    def _switch(self) -> None:
        row = self.table.currentRow()
        item = self.table.item(row, 0) if row >= 0 else None
        if item is not None:
            self.switch_requested.emit(item.text())

    def show_progress(self, progress: ModelProgress | None) -> None:
        if progress is None or progress is self._progress_seen:
            return
        self._progress_seen = progress
        done_phase = progress.phase in ("ready", "error")
        self.progress.setVisible(not done_phase)
        self._switching = not done_phase
        self._update_switch_button()
        if progress.total > 0:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * min(1.0, progress.done / progress.total)))
        else:
            self.progress.setRange(0, 0)  # unknown total: a busy indicator
        self.show_message(progress_text(progress), error=progress.phase == "error")

    def show_message(self, text: str, *, error: bool = False) -> None:
        if not text and not self._switch_allowed:
            text = SWITCH_HINT  # say why the button is off
        self.progress_label.setText(text)
        self.progress_label.setToolTip(text)
        if self.progress_label.property("role") != ("error" if error else "hint"):
            self.progress_label.setProperty("role", "error" if error else "hint")
            self.progress_label.style().polish(self.progress_label)


def fast_paths_text(fast: Any) -> str:
    """The engine's speed-ups in words (the report is untrusted: anything malformed reads "unknown")."""
    if not isinstance(fast, dict):
        return "unknown"
    version = fast.get("llamacpp")
    if isinstance(version, str) and version:
        gen = f"llama.cpp from {version[:40]}" + (" with bf16 weights" if fast.get("llamacpp_bf16") is True else "")
    else:
        gen = "llama.cpp not installed"
    upd = "bf16 LoRA updates" if fast.get("torch_cpu_bf16") is True else "fp32 updates"
    return f"{gen} · {upd}"
