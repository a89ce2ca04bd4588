"""How many new identities a bootstrap credentials (engine/swarm/issuance.py), on a hand-driven clock;
the same with a real BootstrapServer and websocket clients is in test_bootstrap.py."""

from __future__ import annotations

from engine.swarm.issuance import IdentityGate, address_key


def test_identity_gate_charges_only_new_keys_and_stays_bounded() -> None:
    gate = IdentityGate(per_ip_burst=2, per_ip_interval_s=30.0, burst=5, rate_per_s=0.01, known=3, addresses=2,
                        now=0.0)
    assert gate.admit("k1", "10.0.0.1", 0.0) is None and gate.admit("k2", "10.0.0.1", 0.0) is None
    refusal = gate.admit("k3", "10.0.0.1", 1.0)
    assert refusal is not None and refusal.scope == "address" and 29 <= refusal.retry_after_s <= 30
    assert gate.admit("k1", "10.0.0.1", 1.0) is None  # known: not charged, not refused
    assert gate.admit("k3", "10.0.0.1", 31.0) is None  # one token back after the interval
    # The per-address refusal spent no global token (else 10.0.0.2's second key would be refused).
    assert gate.admit("k4", "10.0.0.2", 31.0) is None and gate.admit("k5", "10.0.0.2", 31.0) is None
    refusal = gate.admit("k6", "10.0.0.3", 31.0)
    assert refusal is not None and refusal.scope == "global" and 69 <= refusal.retry_after_s <= 70
    stats = gate.stats()
    assert stats["known_identities"] == 3 and stats["addresses_tracked"] == 2  # both tables bounded
    assert "k1" not in gate and "k5" in gate  # the least recently credentialed key was forgotten
    assert stats["refused_address"] == 1 and stats["refused_global"] == 1


def test_an_ipv6_subscriber_network_is_one_address() -> None:
    assert address_key("2001:db8:1:2::7") == address_key("2001:db8:1:2:ffff::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::7") != address_key("2001:db8:1:2::7")
    assert address_key("::ffff:192.0.2.1") == "192.0.2.1" == address_key("192.0.2.1")
