"""Receipts ("I trained on your group"): the book counts only groups we published, once per peer and
group, within a rate; the frame travels over a direct link and through a real operator-mode NATS board,
where only the origin can read its inbox; the totals survive a restart."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import pytest
from swarm_helpers import make_group, stub_rescore

from engine.sapo.records import Candidate, RolloutGroup
from engine.swarm import protocol as p
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Authority, connect_options, node_inbox
from engine.swarm.pool import content_key
from engine.swarm.receipt_courier import ReceiptCourier
from engine.swarm.receipts import ReceiptBook, ReceiptConfig, receipt_body, receipt_from_wire, receipt_subject
from engine.swarm.wire import Hello

ME, ALICE, BOB = (Identity.generate().peer_id for _ in range(3))


def used(group: RolloutGroup) -> Candidate:
    """A peer's group as the receiving pool holds it: verified here (its rewards, or none right)."""
    return Candidate.of(stub_rescore(lambda g: g.rewards or (0.0,) * len(g.completions))(group))


class Clock:
    def __init__(self) -> None:
        self.now = 36_000.0

    def __call__(self) -> float:
        return self.now


def test_only_published_groups_count_once_per_peer_within_a_rate() -> None:
    clock = Clock()
    book = ReceiptBook(ReceiptConfig(rate_per_s=0.1, burst=2), ME, clock)
    keys = [content_key(make_group(ME, i)) for i in range(4)]
    book.published(keys[:3])
    assert book.receive(ALICE, ME, keys) == 3  # the fourth was never ours
    assert book.receive(ALICE, ME, keys[:2]) == 0  # already counted
    assert book.receive(ALICE, ME, keys[:1]) == 0  # over its rate now (burst 2), and repeated anyway
    assert book.receive(BOB, BOB, keys) == 0  # addressed to someone else
    clock.now += 3600
    assert book.receive(BOB, ME, keys[:1]) == 1
    summary = book.summary()
    assert (summary["shared"], summary["used"], summary["uses"], summary["peers"]) == (3, 3, 4, 2)
    assert summary["hourly"] == [[36_000, 3], [39_600, 1]]
    assert summary["ignored"] == {"unknown_group": 1, "repeated": 2, "rate_limited": 1, "not_for_us": 1}


def test_a_long_run_keeps_counting_in_bounded_memory() -> None:
    """The count of own groups peers trained on kept growing past the keys remembered (it stopped at
    4,096 before), and what is remembered is the newest keys with their senders, nothing more."""
    clock = Clock()
    book = ReceiptBook(ReceiptConfig(remember_published=16, rate_per_s=1000, burst=1000), ME, clock)
    for round_no in range(40):
        keys = [content_key(make_group(ME, 2 * round_no + i)) for i in range(2)]
        book.published(keys)
        assert book.receive(ALICE, ME, keys) == 2 and book.receive(BOB, ME, keys[:1]) == 1
        clock.now += 1
    summary = book.summary()
    assert (summary["shared"], summary["used"], summary["uses"]) == (80, 80, 120)
    assert len(book._published) == 16 and sum(len(s) for s in book._published.values()) <= 32
    first = content_key(make_group(ME, 0))
    assert book.receive(BOB, ME, [first]) == 0 and book.summary()["ignored"]["unknown_group"] == 1


def test_totals_survive_a_restart_and_a_rotten_file_is_skipped() -> None:
    book = ReceiptBook(ReceiptConfig(), ME)
    keys = [content_key(make_group(ME, i)) for i in range(2)]
    book.published(keys)
    book.receive(ALICE, ME, keys)
    again = ReceiptBook(ReceiptConfig(), ME)
    again.restore(json.loads(json.dumps(book.state())))
    assert {k: again.summary()[k] for k in ("shared", "used", "uses", "peers")} == {
        "shared": 2, "used": 2, "uses": 2, "peers": 1}
    for rotten in (None, [], {"shared": -1, "peers": {"x" * 99: 3, ALICE: True}, "hourly": {"zz": 1, "5": -2}}):
        fresh = ReceiptBook(ReceiptConfig(), ME)
        fresh.restore(rotten)
        assert fresh.summary()["uses"] == 0 and fresh.summary()["hourly"] == []


def test_receipts_say_which_trainings_gave_a_gradient_and_the_count_survives_a_restart() -> None:
    """A group a peer trained on whose rewards there were all equal taught it nothing: counted as a use,
    not as an update it helped."""
    book = ReceiptBook(ReceiptConfig(), ME)
    keys = [content_key(make_group(ME, i)) for i in range(3)]
    book.published(keys)
    to, used, gradient = receipt_from_wire(receipt_body(ME, keys, gradient=keys[1:2] + ["f" * 64]))
    assert (to, used, gradient) == (ME, tuple(keys), (keys[1],))  # a key not in the receipt is not sent
    assert book.receive(ALICE, ME, used, gradient) == 3
    assert book.receive(BOB, ME, keys[:2], keys[:2]) == 2
    assert book.receive(BOB, ME, keys[:2], keys[:2]) == 0  # repeated: no second gradient either
    assert (book.summary()["uses"], book.summary()["gradient_uses"]) == (5, 3)
    again = ReceiptBook(ReceiptConfig(), ME)
    again.restore(json.loads(json.dumps(book.state())))
    assert again.summary()["gradient_uses"] == 3
    assert receipt_from_wire({"to": ME, "groups": keys[:1]})[2] == ()  # receipts from before say nothing


def test_a_courier_marks_the_groups_whose_rewards_here_were_mixed() -> None:
    me, alice = Identity.generate(), Identity.generate()
    mine, theirs = _linked(me, alice)
    mixed = make_group(me.peer_id, 1).with_rewards((1.0, 0.0))
    flat = make_group(me.peer_id, 2).with_rewards((0.0, 0.0))
    sent: list[bytes] = []  # the link's outgoing frames (the courier only calls send on a link)
    link = types.SimpleNamespace(send=sent.append)
    courier = ReceiptCourier(theirs.protocol, ReceiptConfig(), lambda peer: link, None, None)  # type: ignore[arg-type]
    assert asyncio.run(courier.send([used(mixed), used(flat)])) == 1
    (event,) = mine.receive(sent[0])
    assert isinstance(event, p.ReceiptReceived)
    assert event.keys == (content_key(mixed), content_key(flat)) and event.gradient == (content_key(mixed),)


@pytest.mark.parametrize("body", [{}, {"to": ME}, {"to": ME, "groups": []}, {"to": ME, "groups": ["x"]},
                                  {"to": ME, "groups": ["A" * 64]}, {"to": 5, "groups": ["a" * 64]},
                                  {"to": ME, "groups": ["a" * 64] * 17},
                                  {"to": ME, "groups": ["a" * 64], "gradient": ["b" * 64]},
                                  {"to": ME, "groups": ["a" * 64], "gradient": "a" * 64}])
def test_malformed_receipts_are_refused(body: dict) -> None:
    with pytest.raises(ProtocolError):
        receipt_from_wire(body)


def _linked(me: Identity, other: Identity) -> tuple[p.PeerConnection, p.PeerConnection]:
    mine = p.PeerConnection(p.SwarmProtocol(me, ProtocolLimits()), Hello("0" * 16, "node", "m", "t", None), 0.0)
    theirs = p.PeerConnection(p.SwarmProtocol(other, ProtocolLimits()), Hello("1" * 16, "node", "m", "t", None), 0.0)
    assert isinstance(mine.receive(theirs.hello_frame())[0], p.HelloReceived)
    return mine, theirs


def test_a_receipt_over_a_direct_link_comes_only_from_the_links_peer() -> None:
    me, alice, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    mine, theirs = _linked(me, alice)
    key = content_key(make_group(me.peer_id))
    (event,) = mine.receive(theirs.protocol.encode("receipt", receipt_body(me.peer_id, [key])))
    assert isinstance(event, p.ReceiptReceived) and event == p.ReceiptReceived(alice.peer_id, me.peer_id, (key,))
    forged = p.SwarmProtocol(mallory, ProtocolLimits()).encode("receipt", receipt_body(me.peer_id, [key]))
    (event,) = mine.receive(forged)  # relayed by alice but signed by a third party
    assert isinstance(event, p.FrameRefused) and event.reason == "wrong_signer"


@pytest.fixture(scope="module")
def nats_url():  # type: ignore[no-untyped-def]
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    auth = Authority.generate()
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config())) as srv:
        yield auth, srv.url


@pytest.mark.timeout(60)
def test_receipts_through_the_board_reach_only_their_origin(nats_url, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from engine.swarm.board_client import BoardClient, nats_board_factory
    from engine.swarm.loops import Backoff
    from engine.swarm.nats_board import STREAM, create_board_stream

    auth, url = nats_url
    origin, user = Identity.generate(), Identity.generate()

    async def client_for(ident: Identity, courier_state: Path) -> tuple[BoardClient, ReceiptCourier]:
        proto = p.SwarmProtocol(ident, ProtocolLimits())
        holder: list[ReceiptCourier] = []
        client = BoardClient(proto, lambda lvl, msg: None, nats_board_factory(60, 1 << 20),
                             on_receipt=lambda data: holder[0].from_board(data))
        courier = ReceiptCourier(proto, ReceiptConfig(), lambda peer: None, client, courier_state)
        holder.append(courier)
        cred = auth.issue(ident.peer_id, STREAM, 60)
        assert client.set_credential(cred.jwt, cred.expires_at)
        await asyncio.wait_for(client.connect_loop([url], Backoff(0.1, 0.5)), 20)
        return client, courier

    async def main() -> None:
        await create_board_stream(url, auth)
        a, a_courier = await client_for(origin, tmp_path / "a.json")
        b, b_courier = await client_for(user, tmp_path / "b.json")
        try:
            group = make_group(origin.peer_id, 3)
            a_courier.published([group])
            assert await b_courier.send([used(group), used(make_group(origin.peer_id, 4))]) == 1  # one per origin
            for _ in range(50):
                if a_courier.stats()["uses"]:
                    break
                await asyncio.sleep(0.1)
            stats = a_courier.stats()
            assert (stats["used"], stats["uses"], stats["peers"]) == (1, 1, 1)
            assert stats["ignored"] == {"unknown_group": 1}  # group 4 was never published by the origin
            # The user cannot read the origin's inbox: the server refuses the subscription.
            errors: list[Exception] = []

            async def on_error(exc: Exception) -> None:
                errors.append(exc)

            import nats

            cred = auth.issue(user.peer_id, STREAM, 60)
            snoop = await nats.connect(servers=[url], error_cb=on_error, allow_reconnect=False,
                                       **connect_options(user.sign, lambda: cred, node_inbox(user.peer_id)))
            await snoop.subscribe(receipt_subject(origin.peer_id))
            await snoop.flush()
            await asyncio.sleep(0.3)
            assert any("ermissions" in str(e) for e in errors), errors
            await snoop.close()
            a_courier.save()
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["used"] == 1 and saved["peers"] == {user.peer_id: 1}
