"""The inbound gate on its own (its HTTP answers over real sockets are in test_transport and
test_bootstrap): caps per address and in all, and no entry left for an address with nothing open."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.swarm.admission import InboundGate


def _from(ip: str) -> SimpleNamespace:
    return SimpleNamespace(remote_address=(ip, 40000))


def test_the_per_address_cap_counts_open_links_and_forgets_closed_ones() -> None:
    gate = InboundGate(max_links=10, max_per_ip=2, full_text="full\n")
    with gate.holding(_from("10.0.0.1")), gate.holding(_from("10.0.0.1")):
        refusal = gate.refuse(_from("10.0.0.1"), open_links=2, stopping=False)
        assert refusal is not None and refusal.status_code == 429 and b"2 links" in refusal.body
        assert gate.refuse(_from("10.0.0.2"), open_links=2, stopping=False) is None
        assert gate.refused_per_ip == 1
    assert gate.per_ip == {}  # a scan from many addresses leaves nothing behind
    assert gate.refuse(_from("10.0.0.1"), open_links=0, stopping=False) is None


def test_full_or_stopping_is_a_503_with_the_servers_text() -> None:
    gate = InboundGate(max_links=1, max_per_ip=0, full_text="node at its connection cap\n")
    for open_links, stopping in ((1, False), (0, True)):
        refusal = gate.refuse(_from("10.0.0.1"), open_links, stopping)
        assert refusal is not None and refusal.status_code == 503 and refusal.body == b"node at its connection cap\n"
    assert gate.refuse(object(), open_links=0, stopping=False) is None  # no address: no per-address cap to pass


def test_the_count_is_released_when_the_link_fails() -> None:
    gate = InboundGate(max_links=10, max_per_ip=1, full_text="full\n")
    with pytest.raises(RuntimeError), gate.holding(_from("10.0.0.1")):
        raise RuntimeError("handshake failed")
    assert gate.per_ip == {}
