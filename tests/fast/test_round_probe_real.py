"""The doctor's probe for real: half a round of the model it picks, on this machine, stored once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.round_probe import stored_probe


def _doctor(data_dir: Path, *args: str) -> tuple[dict[str, Any], str]:
    out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--offline", "--data-dir",
                          str(data_dir), *args], capture_output=True, text=True, timeout=600, check=True)
    rep: dict[str, Any] = json.loads(out.stdout)
    return rep, out.stderr


def test_a_fresh_machine_is_probed_once_and_the_probe_stands_until_rounds_replace_it(tmp_path: Path) -> None:
    before, _ = _doctor(tmp_path, "--no-probe")
    pick = next(c for c in before["candidates"] if c["model"] == before["pick"]["model"])
    if before["device"]["kind"] != "cpu" or pick["availability"] != "installed":
        pytest.skip("the probe times a CPU round of a model on this machine")
    assert before["lent"]["source"] == "estimated"
    probed, said = _doctor(tmp_path)  # nothing measured or stored yet: it probes
    assert "Probing this machine" in said
    lent = probed["lent"]
    assert lent["source"] == "probed", said
    probe = stored_probe(tmp_path, before["pick"]["model"], lent["threads"])
    assert probe is not None and probe["completions_probed"] == before["round"]["questions"] * before["round"]["completions"]
    assert probe["update_seconds_per_completion"] > 0 and 0 < probe["generate_seconds"] < probe["round_seconds"]
    assert lent["round_seconds"] == pytest.approx(probe["round_seconds"], abs=0.2)
    again, said_again = _doctor(tmp_path)
    assert "Probing" not in said_again and again["lent"]["source"] == "probed"  # stored: not probed again
