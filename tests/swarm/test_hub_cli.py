"""`sapo hub key | consent | issue`: a member's consent and the bootstrap operator's issuance, end to end."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from engine.cli import build_parser, main
from engine.cli.bootstrap import _embedded_board
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


def test_the_bootstraps_embedded_board_opens_a_leaf_port_for_hubs_only_when_asked(tmp_path: Path) -> None:
    for flags, wants_leaf in ((["--nats-leaf-port", "0"], True), ([], False)):
        args = build_parser().parse_args(["bootstrap", "--host", "127.0.0.1", "--port", "0",
                                          "--data-dir", str(tmp_path / str(wants_leaf)), *flags])
        nats, _authority, _urls = _embedded_board(args, own_tls=False)
        try:
            assert ("leafnode" in nats.ports) is wants_leaf
            if wants_leaf:  # a real leaf listener: it greets with the server's INFO
                with socket.create_connection(("127.0.0.1", nats.ports["leafnode"]), timeout=5) as conn:
                    assert conn.recv(5) == b"INFO "
        finally:
            nats.stop()
