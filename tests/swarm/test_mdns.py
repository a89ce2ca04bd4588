"""mDNS: interface choice, TXT validation, swarm names, and nodes finding each other on loopback.

Every test announces in a swarm of its own (`unique_swarm`), so a contributor's node running on the same
machine (the default swarm) is neither found by these nodes nor finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from swarm_helpers import Node, async_test, real_groups, swarm_config, wait_for
from zeroconf import IPVersion, service_type_name
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from engine.cli import run as run_cli
from engine.swarm.config import DEFAULT_SWARM, SwarmConfig
from engine.swarm.errors import DuplicateIdentityError
from engine.swarm.identity import Identity
from engine.swarm.mdns import (
    SERVICE_TYPE,
    MdnsService,
    parse_service,
    pick_interfaces,
    service_type,
    txt_properties,
)

pytestmark = pytest.mark.timeout(60)


def unique_swarm() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


def lan_config(swarm: str) -> Any:
    return swarm_config(mdns=True, mdns_interfaces=("127.0.0.1",), swarm_name=swarm)

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


def test_swarm_names_in_txt_and_service_type() -> None:
    ident, lab = Identity.generate(), unique_swarm()
    props = {k.encode(): v.encode() for k, v in txt_properties(ident, 7701, "seed", "t", lab).items()}
    peer = parse_service("x", props, ["127.0.0.1"], 7701)
    assert peer is not None and peer.swarm == lab
    older = {k: v for k, v in props.items() if k != b"swarm"}  # a build before swarm names: the default
    parsed = parse_service("x", older, ["127.0.0.1"], 7701)
    assert parsed is not None and parsed.swarm == DEFAULT_SWARM
    assert parse_service("x", {**props, b"swarm": b"Not A Name"}, ["127.0.0.1"], 7701) is None
    # The default swarm keeps the type released builds browse; others get a valid type of their own.
    assert service_type(DEFAULT_SWARM) == SERVICE_TYPE
    types = {service_type(name) for name in (lab, unique_swarm(), "a", "z" * 63)}
    assert len(types) == 4 and SERVICE_TYPE not in types
    assert all(service_type_name(t) == t for t in types)


def test_swarm_name_is_validated_and_set_from_the_command_line(tmp_path: Path) -> None:
    assert SwarmConfig().swarm_name == DEFAULT_SWARM
    for bad in ("", "Lab", "lab swarm", "-lab", "x" * 64, "lab.", 7):
        with pytest.raises(ValueError, match="swarm_name"):
            SwarmConfig(swarm_name=bad)  # type: ignore[arg-type]
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--data-dir", str(tmp_path), "--swarm", "lab-7"])
    assert run_cli.build_config(args).swarm.swarm_name == "lab-7"
    args = parser.parse_args(["run", "--data-dir", str(tmp_path)])
    assert run_cli.build_config(args).swarm.swarm_name == DEFAULT_SWARM


@async_test
async def test_two_nodes_find_each_other_and_goodbye() -> None:
    cfg = lan_config(unique_swarm())
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
    ident, swarm = Identity.generate(), unique_swarm()
    first = MdnsService(ident, 7701, "seed", "t", ["127.0.0.1"], print, print, print, swarm=swarm)
    await first.start()
    copy = MdnsService(Identity(ident._key), 7702, "seed", "t", ["127.0.0.1"], print, print, print,
                       swarm=swarm)
    try:
        with pytest.raises(DuplicateIdentityError, match="another node is already running with this identity"):
            await copy.start()
    finally:
        await copy.stop()
        await first.stop()


@async_test
async def test_other_swarms_on_the_lan_are_not_peers() -> None:
    """Two nodes of our swarm find each other; a node of another swarm on the same host, and a record under
    our service type that names another swarm (crafted, or a hash collision), are not peers."""
    ours, theirs = unique_swarm(), unique_swarm()
    other = Node(lan_config(theirs))
    a, b = Node(lan_config(ours)), Node(lan_config(ours))
    zc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    stranger = Identity.generate()
    try:
        await other.service.start()
        # the other swarm's node's port: a wrong dial would link it
        port = int(other.service.listen_url.rsplit(":", 1)[1])
        record = AsyncServiceInfo(service_type(ours), f"stranger.{service_type(ours)}", port=port,
                                  parsed_addresses=["127.0.0.1"], server="stranger.local.",
                                  properties=txt_properties(stranger, port, "seed", "t", theirs))
        await (await zc.async_register_service(record))
        await asyncio.gather(a.service.start(), b.service.start())
        await wait_for(lambda: a.peer_ids() == {b.identity.peer_id} and b.peer_ids() == {a.identity.peer_id},
                       timeout=20, what="mDNS discovery within our swarm")
        await wait_for(lambda: a.service.lan.foreign_count == 1 and b.service.lan.foreign_count == 1,
                       timeout=10, what="the other swarm's record seen and ignored")
        await asyncio.sleep(1.0)  # time for a wrong dial to show
        assert set(a.service.lan.peers) == {b.identity.peer_id}
        assert set(b.service.lan.peers) == {a.identity.peer_id}
        assert a.peer_ids() == {b.identity.peer_id} and b.peer_ids() == {a.identity.peer_id}
        assert not other.peer_ids() and not other.service.lan.peers  # its own type: it never saw ours
        assert other.service.lan.foreign_count == 0
    finally:
        await zc.async_close()
        for node in (a, b, other):
            await node.service.stop()
