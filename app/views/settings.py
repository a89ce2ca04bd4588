"""Settings: what the person lending the machine controls. Checked locally with the engine's own
ContributorSettings before sending, and again by the engine (the engine's answer is the truth)."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.settings import ContributorSettings

SNOOZE_S = 3600.0


class SettingsView(QWidget):
    apply_requested = Signal(dict)  # only the changed fields
    pause_after_round_requested = Signal()
    snooze_requested = Signal(float)
    resume_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._current = ContributorSettings()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.addWidget(self._now_box())
        self._make_fields()
        for box in self._field_boxes():
            layout.addWidget(box)
        layout.addLayout(self._apply_row())
        layout.addStretch(1)
        self._connect_signals()

    def _now_box(self) -> QGroupBox:
        """Pause, snooze or resume at once: actions, not settings to apply."""
        now_box = QGroupBox("Right now")
        now = QHBoxLayout(now_box)
        self.pause_button = QPushButton("Finish this round, then pause")
        self.snooze_button = QPushButton("Snooze for an hour")
        self.resume_button = QPushButton("Resume")
        self.snooze_label = QLabel()
        self.snooze_label.setProperty("role", "hint")
        for button in (self.pause_button, self.snooze_button, self.resume_button):
            now.addWidget(button)
        now.addWidget(self.snooze_label, 1)
        return now_box

    def _make_fields(self) -> None:
        """One editor per ContributorSettings field (`edited` reads them back)."""
        self.bootstrap_url = QLineEdit()
        self.bootstrap_url.setPlaceholderText("wss://bootstrap.example.org  (empty: LAN only)")
        self.lan_discovery = QCheckBox("Find peers on this network (mDNS)")
        self.cpu_cores = QSpinBox()
        self.cpu_cores.setRange(0, 1024)
        self.cpu_cores.setSpecialValueText("automatic (every core you leave free)")
        self.use_gpu = QCheckBox("Use the GPU when there is one")
        self.only_when_idle = QCheckBox("Only when the computer is idle")
        self.idle_minutes = QSpinBox()
        self.idle_minutes.setRange(1, 24 * 60)
        self.idle_minutes.setSuffix(" min without input")
        self.pause_on_battery = QCheckBox("Pause while on battery")
        self.max_temperature_c = QDoubleSpinBox()
        self.max_temperature_c.setRange(0, 150)
        self.max_temperature_c.setDecimals(0)
        self.max_temperature_c.setSuffix(" °C")
        self.max_temperature_c.setSpecialValueText("no cap")
        self.schedule = QLineEdit()
        self.schedule.setPlaceholderText("e.g. Mon-Fri 18:00-08:00, Sat-Sun 00:00-24:00  (empty: any time)")
        self.schedule.setToolTip("Weekly windows in this computer's local time; a window that ends at or before "
                                 "its start runs past midnight. Outside them the engine pauses and says when "
                                 "it runs next.")
        self.start_at_login = QCheckBox("Start contributing when I log in")
        self.start_paused = QCheckBox("Start paused: wait for Resume (or `sapo resume`)")
        self.keep_running_on_close = QCheckBox("Keep contributing in the background when the window closes")
        for spin in (self.cpu_cores, self.idle_minutes, self.max_temperature_c):
            spin.setMaximumWidth(320)

    def _field_boxes(self) -> tuple[QGroupBox, ...]:
        """The fields in three groups: Network, Resources, This app."""
        network = QGroupBox("Network")
        form = QFormLayout(network)
        form.addRow("Bootstrap server:", self.bootstrap_url)
        form.addRow("", self.lan_discovery)
        resources = QGroupBox("Resources")
        form2 = QFormLayout(resources)
        form2.addRow("CPU cores:", self.cpu_cores)
        form2.addRow("", self.use_gpu)
        form2.addRow("", self.only_when_idle)
        form2.addRow("Idle after:", self.idle_minutes)
        form2.addRow("", self.pause_on_battery)
        form2.addRow("Temperature cap:", self.max_temperature_c)
        form2.addRow("Schedule:", self.schedule)
        app_box = QGroupBox("This app")
        form3 = QFormLayout(app_box)
        form3.addRow("", self.start_at_login)
        form3.addRow("", self.start_paused)
        form3.addRow("", self.keep_running_on_close)
        return network, resources, app_box

    def _apply_row(self) -> QHBoxLayout:
        """A line saying what Apply did or why it could not, then Revert and Apply."""
        buttons = QHBoxLayout()
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.apply_button = QPushButton("Apply")
        self.revert_button = QPushButton("Revert")
        buttons.addWidget(self.message, 1)
        buttons.addWidget(self.revert_button)
        buttons.addWidget(self.apply_button)
        return buttons

    def _connect_signals(self) -> None:
        self.pause_button.clicked.connect(self.pause_after_round_requested)
        self.snooze_button.clicked.connect(lambda: self.snooze_requested.emit(SNOOZE_S))
        self.resume_button.clicked.connect(self.resume_requested)
        self.apply_button.clicked.connect(self._apply)
        self.revert_button.clicked.connect(lambda: self.show_settings(self._current.to_dict()))
        self.only_when_idle.toggled.connect(self.idle_minutes.setEnabled)

    def set_temperature_supported(self, supported: bool) -> None:
        self.max_temperature_c.setEnabled(supported)
        self.max_temperature_c.setToolTip("" if supported else "No temperature sensor was found on this machine.")

    def show_settings(self, data: dict[str, Any]) -> None:
        try:
            self._current = ContributorSettings.from_dict(data)
        except ValueError as exc:
            self.show_error(f"the engine sent settings this app cannot read: {exc}")
            return
        s = self._current
        self.bootstrap_url.setText(s.bootstrap_url)
        self.lan_discovery.setChecked(s.lan_discovery)
        self.cpu_cores.setValue(s.cpu_cores)
        self.use_gpu.setChecked(s.use_gpu)
        self.only_when_idle.setChecked(s.only_when_idle)
        self.idle_minutes.setValue(s.idle_minutes)
        self.idle_minutes.setEnabled(s.only_when_idle)
        self.pause_on_battery.setChecked(s.pause_on_battery)
        self.max_temperature_c.setValue(s.max_temperature_c)
        self.schedule.setText(s.schedule)
        self.start_at_login.setChecked(s.start_at_login)
        self.start_paused.setChecked(s.start_paused)
        self.keep_running_on_close.setChecked(s.keep_running_on_close)
        snoozed = s.snooze_until > time.time()
        self.snooze_label.setText(
            f"Snoozed until {time.strftime('%H:%M', time.localtime(s.snooze_until))}" if snoozed else "")

    def set_tray_available(self, available: bool) -> None:
        """Without a tray icon nothing would show an engine left running, so closing the window stops it:
        the option is disabled and says why."""
        self.keep_running_on_close.setEnabled(available)
        if not available:
            self.keep_running_on_close.setText("Keep contributing in the background when the window closes "
                                               "(needs a system tray; without one, closing the window stops "
                                               "contributing)")

    def edited(self) -> dict[str, Any]:
        return {"bootstrap_url": self.bootstrap_url.text().strip(), "lan_discovery": self.lan_discovery.isChecked(),
                "cpu_cores": self.cpu_cores.value(), "use_gpu": self.use_gpu.isChecked(),
                "only_when_idle": self.only_when_idle.isChecked(), "idle_minutes": self.idle_minutes.value(),
                "pause_on_battery": self.pause_on_battery.isChecked(),
                "max_temperature_c": float(self.max_temperature_c.value()),
                "schedule": self.schedule.text().strip(), "start_at_login": self.start_at_login.isChecked(),
                "start_paused": self.start_paused.isChecked(),
                "keep_running_on_close": self.keep_running_on_close.isChecked()}

    def changes(self) -> dict[str, Any]:
        current = self._current.to_dict()
        return {k: v for k, v in self.edited().items() if current.get(k) != v}

    def _apply(self) -> None:
        changes = self.changes()
        if not changes:
            self.show_info("Nothing to change.")
            return
        try:
            ContributorSettings.from_dict(changes, base=self._current)
        except ValueError as exc:
            self.show_error(str(exc))
            return
        self.show_info("Applying…")
        self.apply_requested.emit(changes)

    @property
    def current(self) -> ContributorSettings:
        return self._current

    def show_error(self, text: str) -> None:
        self.message.setProperty("role", "error")
        self.message.setText(text)
        self.message.style().polish(self.message)

    def show_info(self, text: str) -> None:
        self.message.setProperty("role", "hint")
        self.message.setText(text)
        self.message.style().polish(self.message)
