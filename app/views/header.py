"""The window's header: the engine shown (name, device, backend), its state and why it last crashed,
its numbers, and the Pause / Resume / Join-or-Leave buttons. It only draws; the window wires the buttons."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from app.models.node import NodeModel
from app.theme import STATE_COLORS, app_icon, dot
from app.views.machine import short_model_name

MAX_STAT_WIDTH = 220  # px: the model's name in the header, elided in the middle beyond it


class Header(QFrame):
    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("header")
        self._state_drawn: str | None = None  # the state whose colour the label and dot show
        outer = QVBoxLayout(self)
        outer.setContentsMargins(18, 12, 18, 8)
        outer.setSpacing(4)
        row = QHBoxLayout()
        outer.addLayout(row)
        self._add_titles(row)
        row.addSpacing(16)
        self._add_state(row)
        self._add_model_line(outer)
        self._add_stats(row)
        self._add_buttons(row)

    def _add_titles(self, row: QHBoxLayout) -> None:
        """The app's icon and name, and under the name the engine shown."""
        icon = QLabel()
        icon.setPixmap(app_icon().pixmap(44, 44))
        row.addWidget(icon)
        titles = QVBoxLayout()
        title = QLabel("SAPO Swarm")
        title.setObjectName("title")
        self.subtitle = QLabel("")
        self.subtitle.setObjectName("subtitle")
        self.subtitle.setWordWrap(True)  # name, device, backend and swarm: wrap rather than widen the window
        self.subtitle.setMaximumWidth(420)
        titles.addWidget(title)
        titles.addWidget(self.subtitle)
        row.addLayout(titles)

    def _add_state(self, row: QHBoxLayout) -> None:
        """The engine's state (a coloured dot and a word), what it is doing, and why it last crashed."""
        state_box = QVBoxLayout()
        state_row = QHBoxLayout()
        self.state_dot = QLabel()
        self.state_label = QLabel()
        self.state_label.setObjectName("stateLabel")
        state_row.addWidget(self.state_dot)
        state_row.addWidget(self.state_label)
        state_row.addStretch(1)
        self.state_detail = QLabel()
        self.state_detail.setObjectName("stateDetail")
        self.state_detail.setWordWrap(True)  # a long phase ("Loading <model> (a minute or two ...)") wraps, never widens the window
        self.crash_note = QLabel()
        self.crash_note.setObjectName("crashNote")
        self.crash_note.setWordWrap(True)
        self.crash_note.setStyleSheet("color: #b45309")
        self.crash_note.setToolTip("From the engine's supervisor (logs/last_crash.json in the data dir)")
        state_box.addLayout(state_row)
        state_box.addWidget(self.state_detail)
        state_box.addWidget(self.crash_note)
        row.addLayout(state_box, 1)

    def _add_model_line(self, outer: QVBoxLayout) -> None:
        """What is being trained, in one sentence: a newcomer's first question."""
        self.model_line = QLabel()
        self.model_line.setObjectName("modelLine")
        self.model_line.setWordWrap(True)
        self.model_line.setStyleSheet("color: #4b5563")
        outer.addWidget(self.model_line)  # full width under the row: one or two lines, not a tall column

    def _add_stats(self, row: QHBoxLayout) -> None:
        """The engine's numbers, each a value over its name."""
        self.stats: dict[str, QLabel] = {}
        for key, name in (("peers", "peers"), ("round", "round"), ("policy_version", "model updates"),
                          ("model", "model")):
            box = QVBoxLayout()
            value = QLabel("–")
            value.setProperty("role", "statValue")
            value.setAlignment(Qt.AlignmentFlag.AlignCenter)
            if key == "model":  # one width for every name: a longer one must not widen the window
                value.setFixedWidth(MAX_STAT_WIDTH)
            label = QLabel(name)
            label.setProperty("role", "stat")
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            box.addWidget(value)
            box.addWidget(label)
            self.stats[key] = value
            row.addLayout(box)
            row.addSpacing(8)

    def _add_buttons(self, row: QHBoxLayout) -> None:
        """Back home, Pause, Resume and Join-or-Leave at the row's end; `show_node` shows those that apply."""
        # Shown while the window shows another engine of the fleet: one click back to this machine's.
        self.home_button = QPushButton("Back to this machine")
        self.home_button.setVisible(False)
        row.addWidget(self.home_button)
        self.pause_button = QPushButton("Pause after this round")
        self.resume_button = QPushButton("Resume")
        self.resume_button.setToolTip("Lifts your pause and a snooze; the schedule, battery, temperature and "
                                      "idle rules still apply (the line under the state says which one holds)")
        row.addWidget(self.pause_button)
        row.addWidget(self.resume_button)
        self.join_button = QPushButton("Join the swarm")
        self.join_button.setObjectName("joinButton")
        self.join_button.setMinimumHeight(52)
        self.join_button.setCursor(Qt.CursorShape.PointingHandCursor)
        row.addWidget(self.join_button)

    def show_node(self, node: NodeModel, busy: bool, elsewhere: str = "", swarm: str = "") -> None:
        """Draw `node`; `elsewhere` names the fleet engine shown when it is not this machine's, `swarm`
        which swarm it is in."""
        state = node.state if node.connected else "disconnected"
        if state != self._state_drawn:  # a style sheet set re-polishes and re-lays out: only on a change
            self._state_drawn = state
            self.state_dot.setPixmap(dot(STATE_COLORS.get(state, "#8a8f98")))
            self.state_label.setStyleSheet(f"color: {STATE_COLORS.get(state, '#111827')}")
        self.state_label.setText(node.label if node.connected else "Engine not connected")
        self.state_detail.setText((node.activity() or node.detail) if node.connected
                                  else "The app reconnects by itself.")
        note = node.crash_note()
        self.crash_note.setText(note)
        self.crash_note.setVisible(bool(note))
        parts = ([f"Showing {elsewhere}"] if elsewhere else []) + [node.peer_name, node.device.upper(), node.backend,
                                                                   swarm]
        self.subtitle.setText(" · ".join(p for p in parts if p) or "this computer · not started yet")
        self.home_button.setVisible(bool(elsewhere))
        self.stats["peers"].setText(str(node.peers))
        self.stats["round"].setText(f"{node.round:,}")
        self.stats["policy_version"].setText(f"{node.policy_version:,}")
        model = self.stats["model"]
        model.ensurePolished()  # the stat's style sheet font, not the default one, decides where to elide
        model.setText(model.fontMetrics().elidedText(node.model_name or short_model_name(node.model) or "–",
                                                     Qt.TextElideMode.ElideMiddle, MAX_STAT_WIDTH - 8))
        model.setToolTip(node.model)
        self.model_line.setText(node.model_about)
        self.model_line.setVisible(bool(node.model_about))
        join_mode = node.state == "stopped"
        self.join_button.setText("Join the swarm" if join_mode else
                                 "Leaving…" if node.state == "leaving" else "Leave the swarm")
        if self.join_button.property("leave") != (not join_mode):
            self.join_button.setProperty("leave", not join_mode)
            self.join_button.style().polish(self.join_button)
        self.join_button.setEnabled(node.connected and not busy and node.state != "leaving")
        self.pause_button.setVisible(node.state in ("solo", "in_swarm", "joining"))
        self.pause_button.setEnabled(node.connected)
        self.resume_button.setVisible(node.state in ("paused", "pausing"))
