"""The warden's bans outlive a restart: saved to its file, read back with the time they had left; an
unreadable or hostile file costs nothing but its bans (the restart itself: test_bootstrap_restart.py)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.swarm.board_warden import Warden, WardenConfig


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_bans_are_read_back_with_the_time_they_had_left(tmp_path: Path) -> None:
    store = tmp_path / "bans.json"
    mono, wall = Clock(5.0), Clock(1_000_000.0)
    first = Warden(WardenConfig(ban_s=60), mono, store=store, wall=wall)
    first.ban("UFLOOD", mono())
    mono.now += 20
    wall.now += 20
    first.ban("ULATER", mono())
    assert set(json.loads(store.read_text())) == {"UFLOOD", "ULATER"}
    mono2, wall.now = Clock(0.0), wall.now + 30  # a new process: another monotonic clock, 30 s later
    second = Warden(WardenConfig(ban_s=60), mono2, store=store, wall=wall)
    assert second.banned("UFLOOD") and second.banned("ULATER")
    assert set(second.revocations(wall.now)) == {"UFLOOD", "ULATER"}
    mono2.now = 11  # UFLOOD had 60 - 20 - 30 = 10 s left
    assert not second.banned("UFLOOD") and second.banned("ULATER")
    mono2.now = 31
    assert not second.banned("ULATER") and second.revocations(wall.now) == {}


def test_a_junk_or_hostile_file_is_ignored(tmp_path: Path) -> None:
    store = tmp_path / "bans.json"
    for content in ("not json", "[1, 2]", json.dumps({"U1": "soon", "U2": True, "U3": -1, "U4": 1e300})):
        store.write_text(content)
        warden = Warden(WardenConfig(ban_s=60), Clock(0.0), store=store, wall=Clock(1000.0))
        assert warden.revocations(1000.0).keys() <= {"U4"}  # a far future is cut to ban_s
        if "U4" in warden.revocations(1000.0):
            assert warden._banned["U4"] == 60
    missing = Warden(WardenConfig(), store=tmp_path / "none" / "bans.json")
    missing.ban("UX", missing.clock())  # a directory that is gone: the ban holds, the error is kept
    assert missing.banned("UX") and missing.store_error
