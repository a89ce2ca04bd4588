"""The Machine tab's "What this machine gives": training time, CPU time and share, energy, memory.

Energy says "estimated" unless the engine read it from the CPU's own meter: a guess is never shown as
a measurement."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QWidget

ROWS = ("Training time", "CPU time", "Share of this machine", "Energy", "Memory held now")


def duration_text(hours: float) -> str:
    minutes = hours * 60
    if minutes < 1:
        return "under a minute"
    if minutes < 90:
        return f"{minutes:.0f} min"
    return f"{hours:,.1f} h"


def giving_rows(c: dict[str, Any]) -> dict[str, str]:
    """The words for each row from the engine's `contribution` status (already checked by NodeModel)."""
    if not c:
        return {row: "–" for row in ROWS}
    energy = c.get("energy_wh", 0.0)
    energy_text = f"{energy / 1000:,.2f} kWh" if energy >= 1000 else f"{energy:,.1f} Wh"
    if c.get("watts_training"):
        energy_text += f", {c['watts_training']:,.0f} W while training"
    if c.get("groups_peers_trained"):
        energy_text += (f", {c['wh_per_group_peers_trained']:,.2f} Wh per group peers trained on "
                        f"({int(c['groups_peers_trained']):,} groups)")
    return {
        "Training time": f"{duration_text(c.get('train_hours', 0.0))} over {int(c.get('rounds', 0)):,} rounds",
        "CPU time": duration_text(c.get("cpu_hours", 0.0)),
        "Share of this machine": f"{100 * c.get('cpu_share_last_round', 0.0):.0f}% of its CPU in the last round",
        "Energy": energy_text + (" (measured by the CPU's power meter)" if c.get("energy_measured")
                                 else " (estimated from CPU time: no power meter readable here)"),
        "Memory held now": f"{c.get('memory_bytes', 0.0) / 2**30:.2f} GiB",
    }


class GivingBox(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("What this machine gives", parent)
        form = QFormLayout(self)
        self.labels: dict[str, QLabel] = {}
        for row in ROWS:
            label = QLabel("–")
            label.setWordWrap(True)
            self.labels[row] = label
            form.addRow(f"{row}:", label)
        self._shown: dict[str, Any] = {}

    def show_contribution(self, contribution: dict[str, Any]) -> None:
        if contribution == self._shown:
            return
        self._shown = dict(contribution)
        for row, text in giving_rows(contribution).items():
            self.labels[row].setText(text)
