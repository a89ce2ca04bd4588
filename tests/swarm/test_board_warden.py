"""The board's warden on hand-built connection tables: who is charged what, who is revoked, for how long."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.swarm.board_warden import MiB, Offence, PurgeQueue, Warden, WardenConfig

CFG = WardenConfig(user_bytes_per_s=1 * MiB, user_burst_bytes=4 * MiB, user_msgs_per_s=100, user_burst_msgs=1000,
                   address_bytes_per_s=3 * MiB, address_burst_bytes=8 * MiB, ban_s=60)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def conn(cid: int, user: str, ip: str, in_bytes: int, in_msgs: int = 0) -> dict[str, object]:
    return {"cid": cid, "authorized_user": user, "ip": ip, "in_bytes": in_bytes, "in_msgs": in_msgs}


def test_an_honest_rate_is_never_charged_over_and_a_flood_is() -> None:
    clock = Clock()
    warden = Warden(CFG, clock)
    honest, flood = 0, 0
    for step in range(1, 61):  # a minute, read every second
        clock.now = float(step)
        honest += 50_000  # 50 KB/s: the seed model's fast rounds
        flood += 3 * MiB if step > 30 else 50_000
        offences = warden.observe([conn(1, "UHONEST", "10.0.0.1", honest, step * 80),
                                   conn(2, "UFLOOD", "10.0.0.2", flood, step * 80)])
        if step <= 30:
            assert offences == []
        if offences:
            assert [o.user for o in offences] == ["UFLOOD"] and "MiB/s" in offences[0].why
            break
    else:
        pytest.fail("a 3 MiB/s flood was never revoked")
    assert clock.now <= 33  # the 4 MiB burst is gone in about two seconds
    assert warden.banned("UFLOOD") and not warden.banned("UHONEST")
    assert set(warden.revocations(1_000_000.0)) == {"UFLOOD"}
    clock.now += CFG.ban_s + 1
    assert not warden.banned("UFLOOD") and warden.revocations(1_000_000.0) == {}


def first_offences(table: Callable[[int], list[dict[str, object]]], steps: int) -> list[Offence]:
    """A fresh warden reads `table(step)` at second 1, 2, ... up to `steps - 1`: the first offences it
    charges ([] when none)."""
    clock = Clock()
    warden = Warden(CFG, clock)
    offences = []
    for step in range(1, steps):
        clock.now = float(step)
        offences = warden.observe(table(step))
        if offences:
            break
    return offences


def test_many_messages_count_even_when_small() -> None:
    offences = first_offences(lambda step: [conn(1, "UCHATTY", "10.0.0.1", step * 1000, step * 500)], 20)
    assert [o.user for o in offences] == ["UCHATTY"] and "messages/s" in offences[0].why


def test_free_identities_behind_one_address_share_its_budget() -> None:
    """Twenty keys each under the per-user budget, together over the address's: all revoked."""
    offences = first_offences(  # 6 MiB/s in all
        lambda step: [conn(cid, f"USYBIL{cid}", "10.9.9.9", step * 300_000) for cid in range(20)], 30)
    assert {o.user for o in offences} == {f"USYBIL{cid}" for cid in range(20)}
    assert all("address" in o.why for o in offences)


def test_a_reconnecting_flooder_is_charged_for_its_new_connection_and_junk_is_ignored() -> None:
    clock = Clock()
    warden = Warden(CFG, clock)
    clock.now = 1.0
    assert warden.observe([conn(1, "UX", "10.0.0.1", 3 * MiB), "junk", {"cid": "x"},
                           {"cid": 5, "authorized_user": 7, "ip": "1"}]) == []
    clock.now = 2.0  # a new connection (cid 2) of the same user: counted from zero, not forgiven
    offences = warden.observe([conn(2, "UX", "10.0.0.1", 3 * MiB)])
    assert [o.user for o in offences] == ["UX"]


def test_memory_is_bounded_under_churn() -> None:
    clock = Clock()
    warden = Warden(WardenConfig(max_tracked=64), clock)
    for cid in range(10_000):
        clock.now = cid / 100
        warden.observe([conn(cid, f"U{cid}", f"10.{cid % 250}.0.1", 1000)])
    assert len(warden._seen) <= 64


def test_a_revoked_frame_is_purged_while_its_connection_is_listed_and_once_after() -> None:
    # A flood's last frame can be stored after the first purge (it was in flight when the server closed
    # the connection): one purge at revocation left it on the board.
    queue = PurgeQueue()
    queue.add(["flooder"])
    listed = [conn(1, "flooder", "10.0.0.9", 0), conn(2, "honest", "10.0.0.1", 0), "junk"]
    purges = 0
    for table in (listed, listed, [conn(2, "honest", "10.0.0.1", 0)], [], []):
        for user in queue.due(table):
            assert user == "flooder"
            queue.purged(user)
            purges += 1
    assert purges == 3  # on each read that still listed it, and on the first read without it
    assert len(queue) == 0 and queue.due(listed) == []


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="user_bytes_per_s"):
        WardenConfig(user_bytes_per_s=0)
    with pytest.raises(ValueError, match="max_tracked"):
        WardenConfig(max_tracked=3)
