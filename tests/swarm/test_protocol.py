"""The sans-I/O protocol fed bytes: valid, forged, replayed, oversized, malformed, hostile."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from swarm_helpers import frame_dict, make_group, signed_frame

from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import Identity
from engine.swarm.protocol import (
    ByeReceived,
    DuplicateIdentity,
    FrameRefused,
    HelloReceived,
    PeerConnection,
    PeersReceived,
    RolloutsReceived,
    SelfConnection,
    SwarmProtocol,
)
from engine.swarm.wire import Hello, group_from_wire, group_to_wire


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def hello(identity: Identity) -> Hello:
    return Hello(instance=identity.instance, role="node", model="seed", tasks="1", listen=None)


def open_link(sender: Identity, receiver: Identity, limits: ProtocolLimits | None = None,
              clock: Clock | None = None) -> tuple[SwarmProtocol, PeerConnection]:
    """Sender's protocol, plus the receiver's connection after it accepted the sender's hello."""
    limits = limits or ProtocolLimits()
    clock = clock or Clock()
    tx = SwarmProtocol(sender, limits, clock)
    rx = PeerConnection(SwarmProtocol(receiver, limits, clock), hello(receiver), started_at=1.0)
    tx_conn = PeerConnection(tx, hello(sender), started_at=1.0)
    events = rx.receive(tx_conn.hello_frame())
    assert events == [HelloReceived(sender.peer_id, hello(sender))]
    return tx, rx


def only(events: list) -> object:
    assert len(events) == 1, events
    return events[0]


def refused(events: list) -> str:
    event = only(events)
    assert isinstance(event, FrameRefused), event
    return event.reason


def test_rollouts_round_trip_and_rewards_never_travel(alice: Identity, bob: Identity) -> None:
    tx, rx = open_link(alice, bob)
    sent = make_group(alice.peer_id, logprobs=((-0.5, -1.25), (-0.125,))).with_rewards((1.0, 0.0))
    [frame] = tx.encode_rollouts([sent])
    assert b'"rewards"' not in frame
    event = only(rx.receive(frame))
    assert isinstance(event, RolloutsReceived)
    [got] = event.groups
    # Per-token log-probs stay home: (sum, tokens, lowest) per completion is what receivers use.
    assert got == replace(sent, rewards=None, generator_logprobs=None,
                          logprob_summary=((-1.75, 2, -1.25), (-0.125, 1, -0.125)))
    assert got.generator_logprob_sums() == sent.generator_logprob_sums() == (-1.75, -0.125)
    assert event.envelope.raw == frame and event.envelope.sender == alice.peer_id


def test_rewards_on_the_wire_are_ignored(alice: Identity) -> None:
    wire = group_to_wire(make_group(alice.peer_id))
    wire["rewards"] = [1.0, 1.0]
    assert group_from_wire(wire, ProtocolLimits()).rewards is None


def test_replayed_frame_is_dropped_and_counted(alice: Identity, bob: Identity) -> None:
    tx, rx = open_link(alice, bob)
    [frame] = tx.encode_rollouts([make_group(alice.peer_id)])
    assert isinstance(only(rx.receive(frame)), RolloutsReceived)
    assert refused(rx.receive(frame)) == "duplicate"
    assert rx.protocol.refusals.by_reason["duplicate"] == 1


def test_seq_below_the_window_is_refused(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob, ProtocolLimits(replay_window=8))
    body = {"groups": [group_to_wire(make_group(alice.peer_id))]}
    assert isinstance(only(rx.receive(signed_frame(alice, frame_dict(alice, "rollouts", body, seq=100)))),
                      RolloutsReceived)
    assert isinstance(only(rx.receive(signed_frame(alice, frame_dict(alice, "rollouts", body, seq=95)))),
                      RolloutsReceived)  # out of order but inside the window: fine
    assert refused(rx.receive(signed_frame(alice, frame_dict(alice, "rollouts", body, seq=50)))) == "replay_old"


def test_tampered_body_fails_signature(alice: Identity, bob: Identity) -> None:
    tx, rx = open_link(alice, bob)
    [frame] = tx.encode_rollouts([make_group(alice.peer_id, completions=("42",))])
    tampered = frame.replace(b'"42"', b'"43"')
    assert tampered != frame
    assert refused(rx.receive(tampered)) == "bad_signature"


def test_frame_signed_by_another_key_fails(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    mallory = Identity.generate()
    # Claims to be alice, signed by mallory.
    forged = signed_frame(mallory, frame_dict(alice, "rollouts", {"groups": []}, seq=5))
    assert refused(rx.receive(forged)) == "bad_signature"


@pytest.mark.parametrize("mutate, reason", [
    (lambda f: f.update(seq="7"), "bad_schema"),
    (lambda f: f.update(seq=-1), "bad_schema"),
    (lambda f: f.update(seq=2**63), "bad_schema"),
    (lambda f: f.update(seq=True), "bad_schema"),
    (lambda f: f.update(body=[1, 2]), "bad_schema"),
    (lambda f: f.update(ts="now"), "bad_schema"),
    (lambda f: f.update(v=2), "bad_version"),
    (lambda f: f.update(type="exec"), "unknown_type"),
    (lambda f: f.update({"from": "not-a-key"}), "bad_schema"),
    (lambda f: f.update(ts=time.time() - 86400), "stale"),
    (lambda f: f.update(ts=time.time() + 86400), "stale"),
])
def test_envelope_schema(alice: Identity, bob: Identity, mutate, reason: str) -> None:
    _, rx = open_link(alice, bob)
    frame = frame_dict(alice, "rollouts", {"groups": [group_to_wire(make_group(alice.peer_id))]}, seq=9)
    mutate(frame)
    assert refused(rx.receive(signed_frame(alice, frame))) == reason
    assert rx.protocol.refusals.by_reason[reason] == 1


def test_missing_signature(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    raw = json.dumps(frame_dict(alice, "bye", {"reason": "x"}, seq=3)).encode()
    assert refused(rx.receive(raw)) == "bad_schema"


def group_variant(alice: Identity, **changes: object) -> dict:
    wire = group_to_wire(make_group(alice.peer_id))
    for key, value in changes.items():
        if key.startswith("prov_"):
            wire["provenance"][key[5:]] = value
        else:
            wire[key] = value
    return wire


@pytest.mark.parametrize("changes, reason", [
    ({"question_hash": "ab" * 31}, "bad_schema"),
    ({"question_hash": "AB" * 32}, "bad_schema"),
    ({"completions": []}, "bad_schema"),
    ({"completions": ["x"] * 17}, "over_limit"),
    ({"completions": ["x" * 8193]}, "over_limit"),
    ({"completions": [7]}, "bad_schema"),
    ({"ref": {"specialty": "bf", "config": {}, "seed": 1, "index": -1}}, "bad_schema"),
    ({"ref": "basic_arithmetic#3"}, "bad_schema"),
    ({"prov_policy_version": 1.5}, "bad_schema"),
    ({"prov_model_id": ""}, "bad_schema"),
    ({"prov_created_at": -5}, "bad_schema"),
    ({"generator_logprobs": [[-1.0]]}, "bad_schema"),  # one list per completion is required
    ({"generator_logprobs": [[-1.0], [0.5]]}, "bad_schema"),
    ({"generator_logprobs": [[-1.0], [-1.0] * 4097]}, "over_limit"),
])
def test_group_schema(alice: Identity, bob: Identity, changes: dict, reason: str) -> None:
    _, rx = open_link(alice, bob)
    frame = frame_dict(alice, "rollouts", {"groups": [group_variant(alice, **changes)]}, seq=9)
    assert refused(rx.receive(signed_frame(alice, frame))) == reason


def test_too_many_groups(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    body = {"groups": [group_to_wire(make_group(alice.peer_id, i)) for i in range(65)]}
    assert refused(rx.receive(signed_frame(alice, frame_dict(alice, "rollouts", body)))) == "over_limit"


def test_oversize_frame_is_refused_before_parsing(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob, ProtocolLimits(max_frame_bytes=4096))
    assert refused(rx.receive(b"{" + b" " * 5000 + b"}")) == "frame_too_large"
    assert refused(rx.receive("x" * 5000)) == "frame_too_large"


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers(alice: Identity, bob: Identity, literal: bytes) -> None:
    _, rx = open_link(alice, bob)
    frame = signed_frame(alice, frame_dict(alice, "bye", {"reason": "x"}, seq=4))
    # Replacing ts breaks the signature too, but parsing runs first and must catch it.
    raw = frame.replace(b'"ts":', b'"ts":' + literal + b',"old_ts":')
    assert refused(rx.receive(raw)) == "non_finite"


def test_nan_inside_a_signed_logprob(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    frame = signed_frame(alice, frame_dict(alice, "rollouts", {"groups": [group_variant(
        alice, generator_logprobs=[[-1.0], [-2.0]])]}, seq=4))
    assert refused(rx.receive(frame.replace(b"-2.0", b"NaN"))) == "non_finite"


def test_invalid_utf8_and_lone_surrogates(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    frame = signed_frame(alice, frame_dict(alice, "bye", {"reason": "ok"}, seq=4))
    assert refused(rx.receive(frame.replace(b'"ok"', b'"o\xff"'))) == "bad_utf8"
    assert refused(rx.receive(frame.replace(b'"ok"', b'"\\ud800"'))) == "bad_utf8"


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1,2", b"[" * 100000 + b"]" * 100000,
                                 b'{"v":1,"v":1}', b"1" * 5000, b"[]", b'"text"'])
def test_garbage_never_raises(alice: Identity, bob: Identity, raw: bytes) -> None:
    _, rx = open_link(alice, bob)
    assert refused(rx.receive(raw)) in ("bad_json", "bad_schema")


def test_unknown_fields_are_ignored_but_signed(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    wire = group_to_wire(make_group(alice.peer_id))
    wire["future_field"] = {"anything": [1, 2]}
    wire["provenance"]["temperature"] = 0.7
    frame = frame_dict(alice, "rollouts", {"groups": [wire], "compression": "none"}, seq=12)
    frame["route"] = ["a", "b"]
    raw = signed_frame(alice, frame)
    event = only(rx.receive(raw))
    assert isinstance(event, RolloutsReceived) and len(event.groups) == 1
    # The unknown fields are covered by the signature: changing one is a forgery.
    frame["seq"] = 13
    raw2 = signed_frame(alice, frame).replace(b'"route":["a","b"]', b'"route":["a","c"]')
    assert refused(rx.receive(raw2)) == "bad_signature"


def test_group_origin_must_be_the_signer(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    carol = Identity.generate()
    body = {"groups": [group_to_wire(make_group(carol.peer_id))]}
    assert refused(rx.receive(signed_frame(alice, frame_dict(alice, "rollouts", body)))) == "wrong_signer"


def test_relayed_rollouts_from_a_third_party_are_accepted(alice: Identity, bob: Identity) -> None:
    # The link is to alice (a relay); carol's frame arrives through it, carol's signature intact.
    _, rx = open_link(alice, bob)
    carol = SwarmProtocol(Identity.generate(), ProtocolLimits())
    [frame] = carol.encode_rollouts([make_group(carol.identity.peer_id)])
    event = only(rx.receive(frame))
    assert isinstance(event, RolloutsReceived) and event.envelope.sender == carol.identity.peer_id


def test_control_frames_from_a_third_party_are_refused(alice: Identity, bob: Identity) -> None:
    _, rx = open_link(alice, bob)
    carol = SwarmProtocol(Identity.generate(), ProtocolLimits())
    assert refused(rx.receive(carol.encode("bye", {"reason": "spoofed"}))) == "wrong_signer"
    assert rx.state == "open"


def test_frames_before_hello_are_unexpected(alice: Identity, bob: Identity) -> None:
    tx = SwarmProtocol(alice, ProtocolLimits())
    rx = PeerConnection(SwarmProtocol(bob, ProtocolLimits()), hello(bob), 1.0)
    [frame] = tx.encode_rollouts([make_group(alice.peer_id)])
    assert refused(rx.receive(frame)) == "unexpected"
    assert rx.state == "handshake"


def test_peers_and_bye(alice: Identity, bob: Identity) -> None:
    tx, rx = open_link(alice, bob)
    carol = Identity.generate()
    entry = {"id": carol.peer_id, "model": "seed", "tasks": "1", "listen": "ws://10.0.0.2:7701"}
    event = only(rx.receive(tx.encode("peers", {"peers": [entry]})))
    assert isinstance(event, PeersReceived) and event.peers[0].peer_id == carol.peer_id
    bad = dict(entry, listen="http://evil")
    assert refused(rx.receive(tx.encode("peers", {"peers": [bad]}))) == "bad_schema"
    assert refused(rx.receive(tx.encode("peers", {"peers": [entry] * 257}))) == "over_limit"
    assert only(rx.receive(tx.encode("bye", {"reason": "leaving"}))) == ByeReceived("leaving")
    assert rx.state == "closed" and rx.receive(tx.encode("bye", {"reason": "again"})) == []


def test_signer_rate_limit_and_refill(alice: Identity, bob: Identity) -> None:
    clock = Clock()
    limits = ProtocolLimits(peer_rate_per_s=2.0, peer_burst=3.0)
    tx, rx = open_link(alice, bob, limits, clock)  # the hello took one token
    groups = [make_group(alice.peer_id)]
    results = [only(rx.receive(tx.encode_rollouts(groups)[0])) for _ in range(4)]
    assert [type(r).__name__ for r in results] == ["RolloutsReceived"] * 2 + ["FrameRefused"] * 2
    assert rx.protocol.refusals.by_reason["rate_limited"] == 2
    clock.now += 1.0  # 2 tokens back
    assert isinstance(only(rx.receive(tx.encode_rollouts(groups)[0])), RolloutsReceived)


def test_link_rate_limit_runs_before_parsing(alice: Identity, bob: Identity) -> None:
    clock = Clock()
    _, rx = open_link(alice, bob, ProtocolLimits(link_rate_per_s=1.0, link_burst=2.0), clock)
    assert refused(rx.receive(b"junk")) == "bad_json"  # the hello used the first token
    assert refused(rx.receive(b"junk")) == "rate_limited"


def test_self_connection_and_duplicate_identity(alice: Identity) -> None:
    limits = ProtocolLimits()
    proto = SwarmProtocol(alice, limits)
    out_link = PeerConnection(proto, hello(alice), 1.0)
    in_link = PeerConnection(proto, hello(alice), 1.0)
    assert only(in_link.receive(out_link.hello_frame())) == SelfConnection()

    # A copy of alice's key file in another process: same id, new instance, started later.
    copy = Identity(alice._key)
    assert copy.peer_id == alice.peer_id and copy.instance != alice.instance
    copy_link = PeerConnection(SwarmProtocol(copy, limits), hello(copy), started_at=50.0)
    first_link = PeerConnection(SwarmProtocol(alice, limits), hello(alice), started_at=10.0)
    assert only(first_link.receive(copy_link.hello_frame())) == DuplicateIdentity(copy.instance, False)
    assert only(copy_link.receive(first_link.hello_frame())) == DuplicateIdentity(alice.instance, True)


def test_own_frame_echoed_by_a_relay_is_a_duplicate(alice: Identity, bob: Identity) -> None:
    # alice -> relay(bob) -> alice: alice must not take her own frame back as a peer's.
    alice_proto = SwarmProtocol(alice, ProtocolLimits())
    link = PeerConnection(alice_proto, hello(alice), 1.0)
    link.receive(PeerConnection(SwarmProtocol(bob, ProtocolLimits()), hello(bob), 1.0).hello_frame())
    [frame] = alice_proto.encode_rollouts([make_group(alice.peer_id)])
    assert refused(link.receive(frame)) == "duplicate"


def test_encode_rollouts_splits_by_count_and_size(alice: Identity, bob: Identity) -> None:
    limits = ProtocolLimits(max_frame_bytes=64 * 1024, peer_burst=100.0)
    tx, rx = open_link(alice, bob, limits)
    groups = [make_group(alice.peer_id, i, completions=("y" * 2000,) * 4) for i in range(40)]
    frames = tx.encode_rollouts(groups)
    assert len(frames) > 1 and all(len(f) <= limits.max_frame_bytes for f in frames)
    received = [g for f in frames for g in only(rx.receive(f)).groups]  # type: ignore[attr-defined]
    assert [g.ref.index for g in received] == list(range(40))
    many = tx.encode_rollouts([make_group(alice.peer_id, i) for i in range(130)])
    assert len(many) == 3


def test_log_probs_cost_the_wire_per_completion_not_per_token(alice: Identity) -> None:
    """2 x 2,000 per-token values (~48 KB as JSON) travel as two (sum, tokens, lowest) triples."""
    limits = ProtocolLimits(max_frame_bytes=16 * 1024)
    tx = SwarmProtocol(alice, limits)
    group = make_group(alice.peer_id, completions=("a", "b"), logprobs=((-0.123456789,) * 2000,) * 2)
    [frame] = tx.encode_rollouts([group])
    assert len(frame) < 2048 and b"generator_logprobs" not in frame and b'"logprob_summary"' in frame
    got = group_from_wire(json.loads(frame)["body"]["groups"][0], limits)
    assert got.logprob_summary is not None and got.logprob_summary[0][1] == 2000
    assert got.generator_logprob_sums() == pytest.approx(group.generator_logprob_sums())


@pytest.mark.parametrize("summary", [[[-1.0, 1, -1.0]], [[-1.0, 1]], [[0.5, 1, -1.0], [-1.0, 1, -1.0]],
                                     [[-1.0, -2, -1.0], [-1.0, 1, -1.0]], [["x", 1, -1.0], [-1.0, 1, -1.0]]])
def test_malformed_log_prob_summaries_are_refused(alice: Identity, summary: list) -> None:
    wire = group_to_wire(make_group(alice.peer_id))
    wire["logprob_summary"] = summary
    with pytest.raises(ProtocolError):
        group_from_wire(wire, ProtocolLimits())


def test_random_mutations_never_raise(alice: Identity, bob: Identity) -> None:
    import random

    tx, rx = open_link(alice, bob)
    [good] = tx.encode_rollouts([make_group(alice.peer_id, logprobs=((-0.5,), (-1.5,)))])
    assert isinstance(only(rx.receive(good)), RolloutsReceived)
    rng = random.Random(7)
    accepted = 0
    for _ in range(2000):
        frame = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        for event in rx.receive(bytes(frame)):
            accepted += isinstance(event, RolloutsReceived)
    # Only mutations that leave the canonical form unchanged (e.g. float digits past precision)
    # can pass the signature, and then the replay guard already has the seq: nothing new gets in.
    assert accepted == 0
    assert rx.protocol.refusals.total == 2000
    assert rx.protocol.refusals.by_reason["bad_signature"] > 0


def test_deep_nesting_is_refused(alice: Identity) -> None:
    from engine.swarm.errors import ProtocolError
    from engine.swarm.wire import canonical, parse_json

    with pytest.raises(ProtocolError, match="nested too deeply"):
        parse_json("[" * 100_000 + "]" * 100_000)
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(ProtocolError, match="nested too deeply"):
        canonical(nested)
