from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from engine.bus import EventBus
from engine.events import EventError, LogRecord, RoundCompleted, StateChanged, event_from_dict
from engine.settings import ContributorSettings


def test_settings_round_trip_through_toml(tmp_path: Path) -> None:
    s = ContributorSettings.from_dict({"bootstrap_url": 'ws://h:1/"x"', "cpu_cores": 3, "snooze_until": 7})
    s.save(tmp_path)
    assert ContributorSettings.load(tmp_path) == s
    assert not (tmp_path / "settings.toml.tmp").exists()


@pytest.mark.parametrize("bad", [
    {"cpu_cores": "4"}, {"cpu_cores": True}, {"lan_discovery": 1}, {"bootstrap_url": "http://x"},
    {"snooze_until": float("nan")}, {"max_temperature_c": -1}, {"idle_minutes": 0}, [1, 2],
])
def test_settings_refuse_bad_values(bad: object) -> None:
    with pytest.raises(ValueError):
        ContributorSettings.from_dict(bad)


def test_unknown_setting_keys_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text('future_knob = 3\ncpu_cores = 2\n')
    assert ContributorSettings.load(tmp_path).cpu_cores == 2


def test_events_round_trip_and_validate() -> None:
    e = RoundCompleted(round=3, policy_version=3, metrics={"reward_mean": 0.5}, per_specialty_reward={},
                       phase_seconds={"generate": 1.0}, num_local=4, num_external=4)
    assert event_from_dict(e.to_dict()) == e
    with pytest.raises(EventError):
        event_from_dict({"type": "round_completed", "round": 1})
    with pytest.raises(EventError):
        event_from_dict({"type": "nope"})
    bad = e.to_dict() | {"metrics": {"x": float("inf")}}
    with pytest.raises(EventError):
        event_from_dict(bad)


def test_bus_delivers_from_another_thread_with_replay_and_bounds() -> None:
    bus = EventBus(replay=2, queue_size=3)
    bus.publish(LogRecord(level="info", message="a"))
    bus.publish(LogRecord(level="info", message="b"))
    bus.publish(LogRecord(level="info", message="c"))
    seen: list[str] = []
    listened: list[str] = []
    bus.add_listener(lambda ev: listened.append(ev.type))

    async def main() -> None:
        sub = bus.subscribe()
        worker = threading.Thread(target=lambda: [bus.publish(StateChanged(state="solo")) for _ in range(5)])
        worker.start()
        worker.join()
        await asyncio.sleep(0.05)
        while sub._queue:
            ev = await sub.get()
            seen.append(getattr(ev, "message", ev.type))
        assert sub.dropped == 4  # 2 replayed + 5 new into a queue of 3
        sub.close()
        with pytest.raises(StopAsyncIteration):
            await sub.get()

    asyncio.run(main())
    assert seen == ["state_changed"] * 3
    assert listened == ["state_changed"] * 5


def test_the_chosen_model_round_trips_and_rejects_control_characters(tmp_path: Path) -> None:
    s = ContributorSettings.from_dict({"model": "/home/me/models/my \"tuned\" qwen"})
    s.save(tmp_path)
    assert ContributorSettings.load(tmp_path).model == '/home/me/models/my "tuned" qwen'
    for bad in ("seed\nbootstrap_url = \"ws://evil\"", "x" * 1025, "a\x00b"):
        with pytest.raises(ValueError, match="model"):
            ContributorSettings.from_dict({"model": bad})
    with pytest.raises(ValueError, match="string"):
        ContributorSettings.from_dict({"model": 3})


def test_work_progress_travels_as_json_and_refuses_what_it_does_not_know() -> None:
    from engine.events import EventError, WorkProgress, event_from_dict

    event = WorkProgress(phase="updating", round=7, done=0, total=3, detail="learning from 3 groups")
    assert event_from_dict(event.to_dict()) == event
    for bad in ({"phase": "mining"}, {"phase": "updating", "total": -1}, {"phase": "updating", "round": True},
                {"phase": "updating", "detail": "x" * 301}):
        with pytest.raises(EventError):
            event_from_dict({"type": "work_progress", **bad})
