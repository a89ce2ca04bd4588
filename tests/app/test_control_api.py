"""The control API end to end: a real websocket server on 127.0.0.1 in front of the real node."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from conftest import EngineThread
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from engine.control.client import ControlClient, ControlError
from engine.control.protocol import MAX_REQUEST_BYTES, ErrorCode
from engine.events import RoundCompleted, StateChanged


async def _raw(url: str, *frames: str, **kwargs: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Send frames on a bare websocket; -> (replies read until close, close code)."""
    replies: list[dict[str, Any]] = []
    async with connect(url, **kwargs) as ws:
        for frame in frames:
            await ws.send(frame)
        try:
            while True:
                replies.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        except ConnectionClosed:
            pass
        except TimeoutError:
            return replies, None
        return replies, ws.close_code


def test_no_token_no_access(engine: EngineThread) -> None:
    # a request before auth
    replies, code = asyncio.run(_raw(engine.url, '{"id": 1, "method": "status"}'))
    assert code == 1008 and replies[0]["error"]["code"] == ErrorCode.UNAUTHORIZED
    assert "state" not in json.dumps(replies)
    # auth without a token
    replies, code = asyncio.run(_raw(engine.url, '{"id": 1, "method": "auth", "params": {}}'))
    assert code == 1008 and replies[0]["error"]["code"] == ErrorCode.UNAUTHORIZED
    # garbage first frame
    replies, code = asyncio.run(_raw(engine.url, "\x00not json"))
    assert code == 1008 and replies[0]["error"]["code"] == ErrorCode.UNAUTHORIZED
    assert engine.server.refused == 3


def test_wrong_token_is_refused_and_closed(engine: EngineThread) -> None:
    wrong = engine.token[:-1] + ("A" if engine.token[-1] != "A" else "B")

    async def attempt() -> None:
        client = ControlClient(engine.url, wrong)
        with pytest.raises(ControlError) as info:
            await client.connect()
        assert info.value.code == ErrorCode.UNAUTHORIZED
        await asyncio.sleep(0.05)
        assert not client.connected
        await client.close()
    asyncio.run(attempt())
    # a join pipelined right behind a wrong token is never run
    auth = json.dumps({"id": 1, "method": "auth", "params": {"token": wrong}})
    replies, code = asyncio.run(_raw(engine.url, auth, '{"id": 2, "method": "join"}'))
    assert code == 1008 and [r["id"] for r in replies] == [1]
    assert replies[0]["error"]["code"] == ErrorCode.UNAUTHORIZED
    time.sleep(0.3)
    assert engine.status().state == "stopped" and engine.status().round == 0
    assert engine.node.history()["rounds"] == [] and engine.server.refused == 2


def test_silent_clients_are_dropped_after_the_auth_timeout(engine: EngineThread) -> None:
    engine.server._auth_timeout_s = 0.2

    async def idle() -> int | None:
        async with connect(engine.url) as ws:
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            return ws.close_code
    assert asyncio.run(idle()) == 1008


def test_browsers_cannot_connect(engine: EngineThread) -> None:
    """A web page always sends an Origin header: refused before any frame is read."""
    with pytest.raises(InvalidStatus) as info:
        asyncio.run(_raw(engine.url, additional_headers={"Origin": "https://evil.example"}))
    assert info.value.response.status_code == 403


def test_oversized_frames_close_the_connection(engine: EngineThread) -> None:
    async def session() -> int | None:
        async with connect(engine.url, max_size=None) as ws:
            await ws.send(json.dumps({"id": 1, "method": "auth", "params": {"token": engine.token}}))
            assert json.loads(await ws.recv())["result"]["server"] == "sapo-control"
            await ws.send("x" * (MAX_REQUEST_BYTES + 10))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            return ws.close_code
    assert asyncio.run(session()) == 1009  # message too big


def test_bad_requests_get_errors_and_the_session_survives(engine: EngineThread) -> None:
    async def session() -> None:
        async with ControlClient(engine.url, engine.token) as client:
            with pytest.raises(ControlError) as info:
                await client.call("snooze", {"seconds": -1})
            assert info.value.code == ErrorCode.INVALID_PARAMS
            with pytest.raises(ControlError) as info:
                await client.call("no_such_method")
            assert info.value.code == ErrorCode.METHOD_NOT_FOUND
            with pytest.raises(ControlError) as info:  # the node's own validation
                await client.call("update_settings", {"changes": {"bootstrap_url": "http://x"}})
            assert info.value.code == ErrorCode.REJECTED and "ws://" in info.value.message
            with pytest.raises(ControlError) as info:  # the node's own check, with the ids it knows
                await client.call("select_model", {"model_id": "no-such-model"})
            assert info.value.code == ErrorCode.REJECTED and "unknown model 'no-such-model'" in info.value.message
            status = await client.call("status")
            assert status["state"] == "stopped" and set(status) >= {"round", "policy_version", "peers"}
            typed = await client.status()  # the same reply, parsed and checked once
            assert (typed.state, typed.round, typed.data_dir) == ("stopped", status["round"], status["data_dir"])
            settings = await client.call("update_settings", {"changes": {"cpu_cores": 3}})
            assert settings["cpu_cores"] == 3
            assert (await client.call("get_settings"))["cpu_cores"] == 3
    asyncio.run(session())
    assert "cpu_cores = 3" in (engine.data_dir / "settings.toml").read_text()


def test_events_are_pushed_after_subscribe_and_calls_run_concurrently(slow_engine: EngineThread) -> None:
    engine = slow_engine

    async def session() -> tuple[list[Any], list[Any]]:
        async with ControlClient(engine.url, engine.token) as client:
            await client.subscribe(replay=False)
            await client.call("join")
            first: list[Any] = []
            async for event in client.events():
                first.append(event)
                if isinstance(event, RoundCompleted):
                    break
            while (await client.call("status"))["round"] < 1:  # round 1's bookkeeping done: round 2 runs
                await asyncio.sleep(0.005)
            # leave waits for the round in flight (~1 s); status must still answer meanwhile
            leave = asyncio.create_task(client.call("leave"))
            await asyncio.sleep(0.05)
            status = await client.call("status")
            assert status["state"] == "leaving" and status["round"] == 1 and not leave.done()
            await leave
            await asyncio.sleep(0.1)
            return first, client.drain_events()
    first, rest = asyncio.run(session())
    states = [e.state for e in first + rest if isinstance(e, StateChanged)]
    assert states[:2] == ["joining", "solo"] and states[-2:] == ["leaving", "stopped"]
    rounds = [e.round for e in first + rest if isinstance(e, RoundCompleted)]
    assert rounds == [1, 2]  # the round in flight finished, then the node stopped
    assert [r["round"] for r in engine.node.history()["rounds"]] == [1, 2]
    assert engine.status().state == "stopped"


def test_shutdown_runs_the_engines_callback(engine: EngineThread) -> None:
    async def session() -> None:
        async with ControlClient(engine.url, engine.token) as client:
            assert await client.call("shutdown") == {"ok": True}
    asyncio.run(session())
    assert engine.shutdown_requested.wait(5)
