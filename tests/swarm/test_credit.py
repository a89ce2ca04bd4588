"""Credit that cannot be minted or copied, with real signed frames: a receipt counts only from a sender
this node verified a group of, and a re-signed (or reordered) copy of a group is refused as a copy, its
signer flagged, the first signer credited."""

from __future__ import annotations

import time
from dataclasses import replace

from swarm_helpers import real_groups
from test_forged_content import deliver

from engine.node.peer_groups import make_pool
from engine.sapo.reputation import Reputation
from engine.sapo.step import PoolExchange
from engine.swarm import protocol as p
from engine.swarm.config import PoolConfig, ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.pool import content_key
from engine.swarm.receipt_courier import ReceiptCourier
from engine.swarm.receipts import ReceiptConfig, receipt_body


def receipt_frame(sender: Identity, to: str, keys: list[str]) -> bytes:
    """A receipt as its sender's protocol signs it: valid in every field."""
    return p.SwarmProtocol(sender, ProtocolLimits(), time.time).encode("receipt", receipt_body(to, keys, keys))


def test_receipts_from_senders_never_verified_here_count_nothing(alice: Identity, bob: Identity) -> None:
    """Bob published a group; Alice (whose groups Bob's pool verified) and a fresh identity both send a
    signed receipt for it: only Alice's counts."""
    pool = make_pool(PoolConfig(), 96, False)
    assert deliver(alice, bob, real_groups(alice.peer_id, 1, seed=41), pool) == ["pooled"]
    courier = ReceiptCourier(p.SwarmProtocol(bob, ProtocolLimits(), time.time), ReceiptConfig(),
                             lambda _peer: None, board=None, vouched=pool.has_verified)
    [mine] = real_groups(bob.peer_id, 1, seed=42)
    courier.published([mine])
    key = content_key(mine)
    sybils = [Identity.generate() for _ in range(5)]
    for sybil in sybils:  # free identities minting credit through the receipts inbox
        courier.from_board(receipt_frame(sybil, bob.peer_id, [key]))
    assert courier.stats()["used"] == 0 and courier.stats()["ignored"] == {"unverified_sender": 5}
    courier.from_board(receipt_frame(alice, bob.peer_id, [key]))
    assert courier.stats()["used"] == 1 and courier.stats()["uses"] == 1


def test_a_copy_credits_the_first_signer_and_flags_the_copier(alice: Identity, bob: Identity) -> None:
    """Carol re-signs Alice's group with its completions reordered: Bob's pool refuses it as a copy, the
    round step flags Carol, and what Bob trains on (and receipts) is Alice's."""
    carol = Identity.generate()
    pool = make_pool(PoolConfig(), 96, False)
    [original] = real_groups(alice.peer_id, 1, seed=43)
    copy = replace(original, completions=tuple(reversed(original.completions)),
                   provenance=replace(original.provenance, origin_peer=carol.peer_id))
    assert content_key(copy) == content_key(original)  # order and signer are not the content
    assert deliver(alice, bob, [original], pool) == ["pooled"]
    assert deliver(carol, bob, [copy], pool) == ["copied"]
    assert [v.group.provenance.origin_peer for v in pool.candidates()] == [alice.peer_id]
    reputation = Reputation()
    for origin in PoolExchange(pool).copiers():
        reputation.record(origin, flagged=True)
    assert reputation.snapshot()[carol.peer_id]["flagged"] > 0
    assert not pool.has_verified(carol.peer_id)  # and so its receipts count nothing either
