"""mDNS: interface choice, TXT validation, and two nodes finding each other on loopback."""

from __future__ import annotations

import pytest
from swarm_helpers import Node, async_test, real_groups, swarm_config, wait_for

from engine.swarm.errors import DuplicateIdentityError
from engine.swarm.identity import Identity
from engine.swarm.mdns import MdnsService, parse_service, pick_interfaces, txt_properties

pytestmark = pytest.mark.timeout(60)

ADDRS = {"lo": ["127.0.0.1"], "eth0": ["192.168.1.20"], "docker0": ["172.17.0.1"],
         "br-5f2a": ["172.18.0.1"], "veth12": ["169.254.3.3"], "wlan0": ["10.0.0.7", "169.254.9.9"],
         "tailscale0": ["100.64.0.2"], "eth1": ["192.168.2.2"]}
UP = {name: name != "eth1" for name in ADDRS}


def test_auto_skips_loopback_virtual_down_and_link_local() -> None:
    assert pick_interfaces(ADDRS, UP, None) == ["192.168.1.20", "10.0.0.7"]


def test_configured_interfaces_are_used_as_given() -> None:
    assert pick_interfaces(ADDRS, UP, ["docker0", "127.0.0.1"]) == ["172.17.0.1", "127.0.0.1"]
    assert pick_interfaces(ADDRS, UP, ["nonexistent"]) == []


def test_txt_round_trip_and_validation() -> None:
    ident = Identity.generate()
    props = {k.encode(): v.encode() for k, v in txt_properties(ident, 7701, "seed", "tl-3").items()}
    peer = parse_service("x._sapo._tcp.local.", props, ["127.0.0.1"], 7701)
    assert peer is not None
    assert (peer.peer_id, peer.instance, peer.url, peer.model, peer.tasks) == (
        ident.peer_id, ident.instance, "ws://127.0.0.1:7701", "seed", "tl-3")
    for key, value in [(b"v", b"99"), (b"id", b"not-a-key"), (b"inst", b"zz"), (b"model", b"m" * 300)]:
        bad = {**props, key: value}
        result = parse_service("x", bad, ["127.0.0.1"], 7701)
        assert result is None or (key == b"model" and result.model == "")
    assert parse_service("x", props, ["fe80::1"], 7701) is None  # no IPv4 to dial
    assert parse_service("x", props, ["127.0.0.1"], None) is None


@async_test
async def test_two_nodes_find_each_other_and_goodbye() -> None:
    cfg = swarm_config(mdns=True, mdns_interfaces=("127.0.0.1",))
    a, b = Node(cfg), Node(cfg)
    try:
        await a.service.start()
        await b.service.start()
        await wait_for(lambda: a.peer_ids() == {b.identity.peer_id} and b.peer_ids() == {a.identity.peer_id},
                       timeout=20, what="mDNS discovery and a link")
        founders = {p.found_by for p in a.service.peers()} | {p.found_by for p in b.service.peers()}
        assert "mdns" in founders  # one side dialled because of mDNS, the other accepted
        await a.service.publish(real_groups(a.identity.peer_id, 1))
        await wait_for(lambda: len(b.pool) == 1, what="a group over the mDNS link")
        await a.service.stop()
        # Goodbye: b forgets a's announcement (no redial loop against a stopped node), by a's signed
        # bye on the link or its mDNS goodbye, whichever comes first.
        await wait_for(lambda: not b.service.lan.peers, timeout=10, what="mDNS goodbye")
        assert not b.peer_ids()
    finally:
        await a.service.stop()
        await b.service.stop()


@async_test
async def test_copied_identity_on_the_lan_is_refused() -> None:
    ident = Identity.generate()
    first = MdnsService(ident, 7701, "seed", "t", ["127.0.0.1"], print, print, print)
    await first.start()
    copy = MdnsService(Identity(ident._key), 7702, "seed", "t", ["127.0.0.1"], print, print, print)
    try:
        with pytest.raises(DuplicateIdentityError, match="another node is already running with this identity"):
            await copy.start()
    finally:
        await copy.stop()
        await first.stop()
