"""Community hubs (engine/swarm/hub.py): real nats-servers on 127.0.0.1, a board in operator mode with a
leaf listener and a hub as its leaf node. Nodes behind the hub exchange frames with a node on the board
over the hub's one connection; the board bounds the hub's credential to its consenting members."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from swarm_helpers import make_group, node_board

from engine.swarm import hub as h
from engine.swarm import protocol as p
from engine.swarm.board import BoardReader, fetch, key_subject
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ConnectError
from engine.swarm.hub_server import hub_server, leaf_status, write_creds
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Authority, connect_options, decode_jwt, user_nkey_of
from engine.swarm.nats_board import NatsBoard, admin_board, create_board_stream
from engine.swarm.nats_server import NatsServer, NatsServerConfig
from engine.swarm.receipts import receipt_subject

STREAM = "HUBS"


def _json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=3) as resp:
        return json.loads(resp.read())


def test_member_proofs_bound_who_a_hub_may_claim() -> None:
    auth, hub_key = Authority.generate(stream=STREAM), Ed25519PrivateKey.generate()
    hub, other_hub = h.public_nkey(hub_key), h.public_nkey(Ed25519PrivateKey.generate())
    a, b = Identity.generate(), Identity.generate()
    soon = time.time() + 600
    cred = h.issue_hub(auth, hub, [h.member_proof(a, hub, soon), h.member_proof(b, hub, time.time() + 60)], 3600)
    claims = decode_jwt(cred.jwt, auth.account_nkey)
    assert claims["sub"] == hub and claims["nats"]["allowed_connection_types"] == ["LEAFNODE"]
    pub = claims["nats"]["pub"]["allow"]
    assert key_subject(a.peer_id) in pub and key_subject(b.peer_id) in pub
    assert not any(s.startswith(("sapo.rollouts.*", ">", "$JS")) for s in pub)  # no wider than its members
    assert cred.expires_at <= time.time() + 61  # no longer than a member's consent
    forged = dict(h.member_proof(a, hub, soon), peer=b.peer_id)  # a's signature passed off as b's consent
    for bad, why in ((h.member_proof(a, other_hub, soon), "another hub"), (forged, "not signed"),
                     (h.member_proof(a, hub, time.time() - 1), "expired"), ({"peer": 1}, "member proof"),
                     (dict(h.member_proof(a, hub, soon), sig="!!"), "signed|base64")):
        with pytest.raises(ValueError, match=why):
            h.issue_hub(auth, hub, [bad], 3600)
    file = h.make_hub_credential(auth, hub, [h.member_proof(a, hub, soon)], 600)
    assert h.HubCredential.from_json(file.to_json(), hub).members == (a.peer_id,)
    for text, why in (("{", "JSON"), ("[]", "not a hub credential"), (file.to_json(), "another hub key")):
        with pytest.raises(ValueError, match=why):
            h.HubCredential.from_json(text, other_hub if why == "another hub key" else hub)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A board (operator mode, monitoring, a leaf listener) and a hub serving members a and b."""
    auth = Authority.generate(stream=STREAM)
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    hub_key = Ed25519PrivateKey.generate()
    hub = h.public_nkey(hub_key)
    cred = h.make_hub_credential(auth, hub, [h.member_proof(x, hub, time.time() + 600) for x in (a, b)], 600)
    board = NatsServer(NatsServerConfig(websocket_port=None, leafnode_port=0, auth_config=auth.server_config()))
    with board:  # noqa: SIM117 -- the hub needs the started board's leaf URL
        with hub_server(tmp_path_factory.mktemp("hub"), hub_key, cred, [board.leafnode_url or ""]) as srv:
            deadline = time.monotonic() + 10
            while not leaf_status(srv)["connected"] and time.monotonic() < deadline:
                time.sleep(0.05)
            asyncio.run(create_board_stream(board.url, auth))
            yield {"auth": auth, "board": board, "hub": srv, "a": a, "b": b, "c": c, "hub_key": hub_key,
                   "cred": cred}


async def _node(url: str, ident: Identity, auth: Authority):  # type: ignore[no-untyped-def]
    cred = auth.issue(ident.peer_id, STREAM, 60)
    return await (await node_board([url], ident, cred, stream=STREAM, max_age_s=60)).connect(timeout_s=3)


def _frame(ident: Identity, index: int = 0) -> bytes:
    (frame,) = p.SwarmProtocol(ident, ProtocolLimits()).encode_rollouts([make_group(ident.peer_id, index)])
    return frame


@pytest.mark.timeout(30)
def test_nodes_behind_a_hub_exchange_with_the_board_over_one_connection(swarm) -> None:  # type: ignore[no-untyped-def]
    a, b, c, auth = swarm["a"], swarm["b"], swarm["c"], swarm["auth"]
    hub_url, board_url = swarm["hub"].url, swarm["board"].url

    async def main() -> None:
        na, nb, nc = await _node(hub_url, a, auth), await _node(hub_url, b, auth), await _node(board_url, c, auth)
        got: list[bytes] = []
        try:
            await nb.on_receipts(b.peer_id, got.append)
            await na.put(a.peer_id, _frame(a))
            await nb.put(b.peer_id, _frame(b))
            await nc.put(c.peer_id, _frame(c))
            from_hub = await fetch(na, BoardReader(p.SwarmProtocol(a, ProtocolLimits())), 3)
            from_board = await fetch(nc, BoardReader(p.SwarmProtocol(c, ProtocolLimits())), 3)
            assert {r.origin for r in from_hub} == {b.peer_id, c.peer_id}  # the direct node's frame, via the leaf
            assert {r.origin for r in from_board} == {a.peer_id, b.peer_id}  # the hub's nodes' frames
            await nc.send_receipt(b.peer_id, b"receipt for b")  # the board's node -> a node behind the hub
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
            assert got == [b"receipt for b"]
            connz = _json(swarm["board"].monitor_url + "/connz?auth=1")
            conns = connz["connections"]
            users = {conn.get("authorized_user") for conn in conns if conn.get("kind") == "Client"}
            leafs = [conn.get("authorized_user") for conn in conns if conn.get("kind") == "Leafnode"]
            assert leafs == [h.public_nkey(swarm["hub_key"])]  # the hub's one connection carries a and b
            assert _json(swarm["board"].monitor_url + "/leafz")["leafnodes"] == 1
            assert user_nkey_of(c.peer_id) in users and not {user_nkey_of(a.peer_id), user_nkey_of(b.peer_id)} & users
            assert leaf_status(swarm["hub"]) == {"connected": True, "nodes": 2}
        finally:
            for node in (na, nb, nc):
                await node.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_an_honest_hub_holds_each_node_to_its_own_key(swarm) -> None:  # type: ignore[no-untyped-def]
    a, b, c, auth = swarm["a"], swarm["b"], swarm["c"], swarm["auth"]

    async def main() -> None:
        na = await _node(swarm["hub"].url, a, auth)
        try:
            for victim in (b, c):  # a member's key, and a key the hub may not write at all
                with pytest.raises(Exception):  # noqa: B017 -- the hub's server: permissions violation
                    await na.put(victim.peer_id, _frame(a, 9))
        finally:
            await na.close()
        assert "Publish Violation" in swarm["hub"].log_tail(20000)

    asyncio.run(main())


def _rogue_hub(creds: Path, leaf_url: str) -> NatsServer:
    """A hub whose operator turned its local checks off: anyone on it publishes anything."""
    remote = f'leafnodes {{ remotes: [ {{ urls: ["{leaf_url}"], credentials: "{creds.as_posix()}" }} ] }}'
    return NatsServer(NatsServerConfig(websocket_port=None, jetstream=False, auth_config=remote))


async def _stored(board: object, peer: str) -> bytes | None:
    from nats.js.errors import NotFoundError

    try:
        msg = await board.js.get_last_msg(STREAM, key_subject(peer))  # type: ignore[attr-defined]
    except NotFoundError:
        return None
    return bytes(msg.data)


@pytest.mark.timeout(40)
def test_a_rogue_hub_cannot_write_or_read_outside_its_members(swarm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import nats

    a, b, c, auth = swarm["a"], swarm["b"], swarm["c"], swarm["auth"]
    creds = write_creds(tmp_path, swarm["hub_key"], swarm["cred"])

    async def main(rogue_url: str) -> None:
        admin = await admin_board(swarm["board"].url, auth).connect()
        nc_board = await _node(swarm["board"].url, c, auth)
        rogue = await nats.connect(rogue_url)
        heard: list[str] = []

        async def listen(msg: object) -> None:
            heard.append(str(getattr(msg, "subject", "")))

        try:
            await nc_board.put(c.peer_id, _frame(c, 5))
            before = await _stored(admin, c.peer_id)
            for subject in (f"_INBOX.{c.peer_id}.>", receipt_subject(c.peer_id), "$JS.>", ">"):
                await rogue.subscribe(subject, cb=listen)
            await rogue.flush()
            await asyncio.sleep(0.3)  # the subscriptions' interest reaches the board, where it is refused
            await rogue.publish(key_subject(c.peer_id), _frame(a, 6))  # a non-member's key
            await rogue.publish(f"$JS.API.STREAM.PURGE.{STREAM}", b"{}")  # the board's stream itself
            await rogue.publish(key_subject(b.peer_id), _frame(a, 7))  # a member's key, a's frame
            await rogue.flush()
            await nc_board.send_receipt(c.peer_id, b"for c only")
            await asyncio.sleep(0.5)
            assert await _stored(admin, c.peer_id) == before  # neither overwritten nor purged
            # nothing addressed to c left the board (the rogue's own publishes it hears locally)
            assert not [s for s in heard if s in (receipt_subject(c.peer_id), f"_INBOX.{c.peer_id}")
                        or s.startswith(f"_INBOX.{c.peer_id}.")]
            # Writing a member's key gets through (the credential allows it): the frame is a's, so every
            # reader refuses it (signer != slot owner); b's slot is displaced, never forged.
            assert (await _stored(admin, b.peer_id) or b"").find(a.peer_id.encode()) >= 0
            reader = BoardReader(p.SwarmProtocol(c, ProtocolLimits()))
            got = await fetch(nc_board, reader, 4)
            assert b.peer_id not in {r.origin for r in got} and reader.counters["refused"] >= 1
        finally:
            await rogue.close()
            await nc_board.close()
            await admin.close()
        leaf_only = connect_options(swarm["hub_key"].sign, lambda: swarm["cred"])
        with pytest.raises(ConnectError):  # the hub's credential is a leaf's only, not a client's
            await NatsBoard([swarm["board"].url], create=False, connect_options=leaf_only).connect(timeout_s=3)

    with _rogue_hub(creds, swarm["board"].leafnode_url) as rogue_srv:
        deadline = time.monotonic() + 10
        while "Leafnode connection created" not in rogue_srv.log_tail(20000) and time.monotonic() < deadline:
            time.sleep(0.05)
        asyncio.run(main(rogue_srv.url))
