"""`sapo hub key | consent | issue`: a member's consent and the bootstrap operator's issuance, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.swarm.hub import HubCredential
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Authority


def test_key_consent_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Authority.load_or_create(tmp_path / "boot")
    assert main(["hub", "key", "--data-dir", str(tmp_path / "hub")]) == 0
    hub = capsys.readouterr().out.strip()
    assert main(["hub", "key", "--data-dir", str(tmp_path / "hub")]) == 0  # the same key next time
    assert capsys.readouterr().out.strip() == hub
    assert main(["hub", "consent", "--data-dir", str(tmp_path / "node"), "--hub", hub]) == 0
    (tmp_path / "a.json").write_text(capsys.readouterr().out)
    out = tmp_path / "cred.json"
    assert main(["hub", "issue", "--data-dir", str(tmp_path / "boot"), "--hub", hub,
                 "--member", str(tmp_path / "a.json"), "--out", str(out)]) == 0
    node = Identity.load_or_create(tmp_path / "node")
    assert HubCredential.from_json(out.read_text(), hub).members == (node.peer_id,)
    capsys.readouterr()
    assert main(["hub", "issue", "--data-dir", str(tmp_path / "nokeys"), "--hub", hub,
                 "--member", str(tmp_path / "a.json"), "--out", str(out)]) == 2  # never new keys
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "b.json").write_text(json.dumps({"peer": node.peer_id, "hub": hub, "expires": 1, "sig": "x"}))
    assert main(["hub", "issue", "--data-dir", str(tmp_path / "boot"), "--hub", hub,
                 "--member", str(tmp_path / "b.json"), "--out", str(out)]) == 2
    assert "expired" in capsys.readouterr().err
