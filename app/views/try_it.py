"""Try it: ask your model a question like the ones it trains on and see its answer beside the starting
model's, each checked by this machine's verifier; below, your node's own recent completions.

The engine answers between rounds (its model is busy during one), so a question may wait for the
round in flight: the view says what it waits for and for how long. One question at a time from this
window; the engine's refusals (join first, a busy queue, a typed question a seed model cannot read)
are shown as they come. Texts come from another process: every label is plain text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.models.node import NodeModel
from app.theme import task_name
from engine.node.ask import MAX_QUESTION_CHARS

Caller = Callable[..., int]  # EngineBridge.call(method, params, callback)
RECENT_POLL_S = 2.0  # at most this often, and only when a round has finished since
VERDICT_COLORS = {True: "#15803d", False: "#b91c1c", None: "#6b7280"}
ANY = "Any of its tasks"
RECENT_COLUMNS = ("Round", "Task", "Right", "Expected", "Question, then each answer (hover for all of it)")
INTRO = ("Ask your model a question like the ones it trains on and compare its answer with the model it "
         "started from. Both answers are checked by this machine, the same way training rewards them.")



def verdict_text(verdict: dict[str, Any] | None) -> str:
    """"Right", "Wrong", "Not scored" (a typed question) for one model's answer."""
    if not isinstance(verdict, dict):
        return "Not available"
    correct = verdict.get("correct")
    return "✓ Right" if correct is True else "✗ Wrong" if correct is False else "Not scored"


def answer_line(verdict: dict[str, Any] | None) -> str:
    if not isinstance(verdict, dict):
        return ""
    answer = verdict.get("answer")
    if answer is None:
        return "No answer in <answer> tags: the verifier finds nothing to check."
    return f"Its answer: {answer}"


def waiting_text(node: NodeModel, seconds: float) -> str:
    """What an asked question waits for, in the node's current state."""
    state, work = node.state, node.work
    if state == "paused":
        what = "Answering now (the node is paused)…"
    elif state == "joining":
        what = "Waiting for the model to load, then answering…"
    elif state == "pausing":
        what = "Finishing the round in flight, then answering…"
    elif work is not None and work.phase in ("generating", "updating", "evaluating") and work.round:
        what = f"Answering after round {work.round:,}, in flight now…"
    else:
        what = "Answering after this round…"
    return f"{what} {seconds:.0f} s"


def answered_text(result: dict[str, Any]) -> str:
    waited = result.get("waited_s")
    wait = f" (it waited {waited:.0f} s for the round in flight)" if isinstance(waited, (int, float)) and waited >= 1 \
        else ""
    done = int(result.get("round", 0))
    return f"Answered after round {done:,}{wait}." if done else f"Answered before the first round{wait}."


def one_line(text: str, limit: int = 160) -> str:
    """A text on one line (a table row), cut at `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def shown_text(text: str) -> str:
    return text if text.strip() else "(only blank space: the model wrote nothing readable)"


def difficulty_text(result: dict[str, Any]) -> str:
    level = result.get("difficulty")
    if isinstance(level, dict) and isinstance(level.get("level"), int) and isinstance(level.get("levels"), int):
        return f" · difficulty {level['level']} of {level['levels']}"
    return ""


class AnswerBox(QGroupBox):
    """One model's answer: right / wrong, the extracted answer, the full text."""

    def __init__(self, title: str) -> None:
        super().__init__(title)
        layout = QVBoxLayout(self)
        self.verdict = QLabel("–")
        self.verdict.setTextFormat(Qt.TextFormat.PlainText)
        font = self.verdict.font()
        font.setPointSizeF(font.pointSizeF() * 1.25)
        font.setBold(True)
        self.verdict.setFont(font)
        self.answer = QLabel("")
        self.answer.setTextFormat(Qt.TextFormat.PlainText)
        self.answer.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setMaximumHeight(130)
        for widget in (self.verdict, self.answer, self.text):
            layout.addWidget(widget)

    def show_verdict(self, verdict: dict[str, Any] | None, note: str = "") -> None:
        self.verdict.setText(verdict_text(verdict))
        correct = verdict.get("correct") if isinstance(verdict, dict) else None
        self.verdict.setStyleSheet(f"color: {VERDICT_COLORS.get(correct, '#6b7280')};")
        self.answer.setText(answer_line(verdict) if isinstance(verdict, dict) else note)
        self.text.setPlainText(shown_text(str(verdict.get("text", ""))) if isinstance(verdict, dict) else "")


class TryItView(QWidget):
    def __init__(self, node: NodeModel, call: Caller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.node = node
        self._call = call
        self.asked_at: float | None = None  # a question is waiting for its answer
        self.result: dict[str, Any] | None = None
        self.recent: list[dict[str, Any]] = []
        self._recent_round = -1  # the node's round when recent groups were last fetched
        self._recent_at = 0.0
        self._recent_in_flight = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        intro = QLabel(INTRO)
        intro.setWordWrap(True)
        intro.setProperty("role", "hint")
        layout.addWidget(intro)
        layout.addLayout(self._ask_row())
        self.status = QLabel("")
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setWordWrap(True)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # indeterminate: the engine gives no count for an answer
        self.busy.setMaximumHeight(8)
        self.busy.setTextVisible(False)
        self.busy.setVisible(False)
        layout.addWidget(self.status)
        layout.addWidget(self.busy)
        layout.addWidget(self._question_box())
        answers = QHBoxLayout()
        self.yours = AnswerBox("Your model")
        self.start = AnswerBox("The model it started from")
        answers.addWidget(self.yours, 1)
        answers.addWidget(self.start, 1)
        layout.addLayout(answers)
        layout.addWidget(self._recent_box(), 1)
        self.refresh()

    def _ask_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.specialty = QComboBox()
        self.specialty.addItem(ANY, "")
        self.specialty.setMinimumWidth(200)
        self.question_edit = QLineEdit()
        self.question_edit.setMaxLength(MAX_QUESTION_CHARS)
        self.question_edit.setPlaceholderText("…or type your own question (chat models; not scored)")
        self.question_edit.textChanged.connect(self._text_changed)
        self.question_edit.returnPressed.connect(self.ask)
        self.ask_button = QPushButton("Ask a new question")
        self.ask_button.clicked.connect(self.ask)
        row.addWidget(QLabel("Task:"))
        row.addWidget(self.specialty)
        row.addWidget(self.question_edit, 1)
        row.addWidget(self.ask_button)
        return row

    def _question_box(self) -> QGroupBox:
        box = QGroupBox("Question")
        grid = QGridLayout(box)
        self.question = QLabel("Ask a question to see it here.")
        self.expected = QLabel("")
        for i, label in enumerate((self.question, self.expected)):
            label.setTextFormat(Qt.TextFormat.PlainText)
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            grid.addWidget(label, i, 0)
        return box

    def _recent_box(self) -> QGroupBox:
        box = QGroupBox("Your recent completions (your node's own questions in its last rounds)")
        layout = QVBoxLayout(box)
        self.recent_tree = QTreeWidget()
        self.recent_tree.setColumnCount(len(RECENT_COLUMNS))
        self.recent_tree.setHeaderLabels(list(RECENT_COLUMNS))
        self.recent_tree.setUniformRowHeights(True)  # one line a row: the full text is in the tooltip
        header = self.recent_tree.header()
        for col in range(len(RECENT_COLUMNS) - 1):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.recent_empty = QLabel("No rounds yet: join, and your node's questions and answers appear here.")
        self.recent_empty.setProperty("role", "hint")
        layout.addWidget(self.recent_empty)
        layout.addWidget(self.recent_tree, 1)
        return box

    # --- asking ------------------------------------------------------------------------------------
    def _text_changed(self, text: str) -> None:
        self.ask_button.setText("Ask this question" if text.strip() else "Ask a new question")

    def can_ask(self) -> bool:
        return self.node.connected and self.node.state not in ("stopped", "leaving") and self.asked_at is None

    def ask(self) -> None:
        if not self.can_ask():
            return
        params = {"specialty": str(self.specialty.currentData() or ""), "text": self.question_edit.text().strip()}
        self.asked_at = time.monotonic()
        self.status.setProperty("role", "")
        self._call("ask", params, self._answered, 900.0)  # a long round, then the answers
        self.refresh()

    def _answered(self, result: Any, error: str | None) -> None:
        if not isValid(self):
            return  # another engine is shown now: this view was replaced while the question waited
        self.asked_at = None
        if error is not None or not isinstance(result, dict):
            self._say(f"Not answered: {error or 'the engine sent no answer'}", error=True)
        else:
            self.result = result
            self._show_result(result)
            self._say(answered_text(result))
            self._recent_round = -1  # the round moved on while it waited: fetch again
        self.refresh()

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color: #b91c1c;" if error else "")

    def _show_result(self, r: dict[str, Any]) -> None:
        typed = bool(r.get("typed"))
        head = "Your question" if typed else f"A {task_name(str(r.get('specialty', '')))} question{difficulty_text(r)}"
        self.question.setText(f"{head}:\n{r.get('question', '')}")
        note = str(r.get("expected_note") or "")
        expected = r.get("expected")
        self.expected.setText(f"Expected answer: {expected}" + (f" ({note})" if note else "") if expected is not None
                              else note)
        version = (r.get("yours") or {}).get("policy_version")
        self.yours.setTitle(f"Your model (after {int(version):,} updates)" if isinstance(version, int)
                            else "Your model")
        self.yours.show_verdict(r.get("yours"))
        self.start.show_verdict(r.get("start"), str(r.get("start_note") or "Not available."))

    # --- refresh (the window's timer, while this tab is shown) -----------------------------------------
    def refresh(self) -> None:
        waiting = self.asked_at is not None
        self.busy.setVisible(waiting)
        self.ask_button.setEnabled(self.can_ask())
        if waiting:
            self._say(waiting_text(self.node, time.monotonic() - (self.asked_at or 0.0)))
        elif not self.node.connected:
            self._say("Not connected to the engine.")
        elif self.node.state == "stopped" and self.result is None:
            self._say("Join first: your model answers while the node runs (paused is fine).")
        self._fetch_recent()

    def _fetch_recent(self) -> None:
        node, now = self.node, time.monotonic()
        if (not node.connected or self._recent_in_flight or node.round == self._recent_round
                or now - self._recent_at < RECENT_POLL_S):
            return
        self._recent_in_flight, self._recent_at, asked_round = True, now, node.round

        def reply(result: Any, error: str | None) -> None:
            if not isValid(self):
                return  # replaced by a switch of engines meanwhile
            self._recent_in_flight = False
            if error is None and isinstance(result, dict):
                self._recent_round = asked_round
                self.show_recent(result)
        self._call("recent_groups", None, reply)

    def show_recent(self, result: dict[str, Any]) -> None:
        specialties = [s for s in result.get("specialties", []) if isinstance(s, str)]
        known = [self.specialty.itemData(i) for i in range(1, self.specialty.count())]
        if specialties and specialties != known:
            chosen = self.specialty.currentData()
            self.specialty.clear()
            self.specialty.addItem(ANY, "")
            for s in specialties:
                self.specialty.addItem(task_name(s), s)
            self.specialty.setCurrentIndex(max(0, self.specialty.findData(chosen)))
        groups = [g for g in result.get("groups", []) if isinstance(g, dict)]
        if groups == self.recent:
            return
        self.recent = groups
        self.recent_tree.clear()
        for g in groups:
            self.recent_tree.addTopLevelItem(self._group_item(g))
        if groups:
            self.recent_tree.topLevelItem(0).setExpanded(True)  # the newest group's answers, at a glance
        self.recent_empty.setVisible(not groups)

    def _group_item(self, g: dict[str, Any]) -> QTreeWidgetItem:
        question = str(g.get("question", ""))
        item = QTreeWidgetItem([f"{int(g.get('round', 0)):,}", task_name(str(g.get("specialty", ""))),
                                f"{int(g.get('right', 0))} of {int(g.get('total', 0))}",
                                one_line(str(g.get("expected", "")), 40), one_line(question)])
        item.setToolTip(4, question)
        for c in g.get("completions", []):
            if not isinstance(c, dict):
                continue
            reward, text = c.get("reward"), shown_text(str(c.get("text", "")))
            right = isinstance(reward, (int, float)) and reward >= 1.0
            child = QTreeWidgetItem(["", "", "✓ right" if right else "✗ wrong", "", one_line(text)])
            child.setToolTip(4, text)
            child.setForeground(2, QColor(VERDICT_COLORS[right]))
            item.addChild(child)
        return item
