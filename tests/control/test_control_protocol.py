"""The control API's sans-I/O layer: what it accepts, what it refuses, and how it encodes."""

from __future__ import annotations

import json

import pytest

from engine.control.protocol import (
    MAX_REQUEST_BYTES,
    ControlProtocolError,
    ErrorCode,
    Reply,
    encode_error,
    encode_event,
    encode_request,
    encode_result,
    parse_request,
    parse_server_message,
    status_from_wire,
    status_to_wire,
    token_matches,
)
from engine.control.status import NodeStatus, recent_summary
from engine.events import EventError, ModelProgress, RolloutSeen, RoundCompleted


def _code(data: str | bytes) -> ErrorCode:
    with pytest.raises(ControlProtocolError) as info:
        parse_request(data)
    return info.value.code


def test_a_valid_request_gets_defaults_filled_in() -> None:
    request = parse_request(encode_request(7, "pause"))
    assert (request.id, request.method, request.params) == (7, "pause", {"after_round": True})
    request = parse_request('{"id": "a", "method": "history", "params": {"limit": 10}}')
    assert request.params == {"limit": 10}
    assert parse_request(b'{"method": "status"}').id is None


@pytest.mark.parametrize("data, code", [
    ("not json", ErrorCode.PARSE_ERROR),
    (b"\xff\xfe", ErrorCode.PARSE_ERROR),
    ('{"method": "snooze", "params": {"seconds": NaN}}', ErrorCode.PARSE_ERROR),
    ('{"method": "snooze", "params": {"seconds": Infinity}}', ErrorCode.PARSE_ERROR),
    ("[1, 2]", ErrorCode.INVALID_REQUEST),
    ('{"method": 3}', ErrorCode.INVALID_REQUEST),
    ('{"id": true, "method": "status"}', ErrorCode.INVALID_REQUEST),
    ('{"id": {"x": 1}, "method": "status"}', ErrorCode.INVALID_REQUEST),
    ('{"method": "status", "extra": 1}', ErrorCode.INVALID_REQUEST),
    ('{"method": "rm_rf"}', ErrorCode.METHOD_NOT_FOUND),
    ('{"method": "__init__"}', ErrorCode.METHOD_NOT_FOUND),
    ('{"method": "status", "params": [1]}', ErrorCode.INVALID_PARAMS),
    ('{"method": "status", "params": {"x": 1}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "snooze", "params": {}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "snooze", "params": {"seconds": "3600"}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "snooze", "params": {"seconds": -5}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "snooze", "params": {"seconds": 1e12}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "pause", "params": {"after_round": 1}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "history", "params": {"limit": true}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "history", "params": {"limit": 0}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "auth", "params": {"token": ""}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "update_settings", "params": {"changes": {"a": [1]}}}', ErrorCode.INVALID_PARAMS),
    ('{"method": "update_settings", "params": {"changes": {"a": {"b": 1}}}}', ErrorCode.INVALID_PARAMS),
])
def test_malformed_requests_are_refused_with_the_right_code(data: str, code: ErrorCode) -> None:
    assert _code(data) == code


def test_the_request_id_survives_into_the_error_when_it_is_known() -> None:
    with pytest.raises(ControlProtocolError) as info:
        parse_request('{"id": 42, "method": "nope"}')
    assert info.value.request_id == 42


def test_size_and_nesting_limits() -> None:
    big = json.dumps({"method": "update_settings", "params": {"changes": {"bootstrap_url": "x" * MAX_REQUEST_BYTES}}})
    assert _code(big) == ErrorCode.PARSE_ERROR
    deep = '{"method": "status", "params": ' + "[" * 5000 + "]" * 5000 + "}"
    assert _code(deep) in (ErrorCode.PARSE_ERROR, ErrorCode.INVALID_PARAMS)
    many = {"method": "update_settings", "params": {"changes": {f"k{i}": 1 for i in range(65)}}}
    assert _code(json.dumps(many)) == ErrorCode.INVALID_PARAMS
    huge_int = '{"method": "history", "params": {"limit": ' + "9" * 5000 + "}}"
    assert _code(huge_int) == ErrorCode.PARSE_ERROR


def test_token_comparison() -> None:
    assert token_matches("abc" * 10, "abc" * 10)
    assert not token_matches("abc" * 10, "abd" * 10)
    assert not token_matches("short", "abc" * 10)
    assert not token_matches("", "abc" * 10)


def test_encoders_refuse_non_finite_numbers_and_non_json_values() -> None:
    with pytest.raises(ValueError):
        encode_result(1, {"x": float("nan")})
    with pytest.raises(ValueError):
        encode_result(1, {"x": object()})
    event = RoundCompleted(round=1, policy_version=1, metrics={"reward_mean": float("inf")},
                           per_specialty_reward={}, phase_seconds={}, num_local=1, num_external=0)
    with pytest.raises(ValueError):
        encode_event(event)


def test_server_messages_round_trip_and_are_checked() -> None:
    reply = parse_server_message(encode_result(3, {"ok": True}))
    assert isinstance(reply, Reply) and reply.ok and reply.id == 3 and reply.result == {"ok": True}
    error = parse_server_message(encode_error(4, ErrorCode.REJECTED, "no"))
    assert isinstance(error, Reply) and not error.ok and error.error_code == ErrorCode.REJECTED
    seen = RolloutSeen(origin_peer="p", peer_name="n", specialty="bf", question="q", completion="c",
                       reward=None, status="pooled")
    assert parse_server_message(encode_event(seen)) == seen
    progress = ModelProgress(model_id="qwen", phase="download", done=5, total=10)
    assert parse_server_message(encode_event(progress)) == progress


@pytest.mark.parametrize("data", [
    ('{"event": {"type": "round_completed", "round": "1", "policy_version": 1, "metrics": {}, '
     '"per_specialty_reward": {}, "phase_seconds": {}, "num_local": 1, "num_external": 0}}'),
    ('{"event": {"type": "round_completed", "round": 1, "policy_version": 1, "metrics": {"a": "x"}, '
     '"per_specialty_reward": {}, "phase_seconds": {}, "num_local": 1, "num_external": 0}}'),
    '{"event": {"type": "state_changed", "state": ["x"]}}',
    ('{"event": {"type": "rollout_seen", "origin_peer": "p", "peer_name": "n", "specialty": "s", '
     '"question": "q", "completion": "c", "reward": "high", "status": "used"}}'),
    '{"event": {"type": "no_such_event"}}',
    '{"event": {"type": "log_record", "level": "info"}}',
])
def test_malformed_events_from_a_server_are_refused(data: str) -> None:
    with pytest.raises(EventError):
        parse_server_message(data)


@pytest.mark.parametrize("data", ['{"id": 1}', '{"id": 1, "error": "x"}', '{"id": [1], "result": 1}', "[]",
                                  '{"id": 1, "error": {"code": "x", "message": "m"}}'])
def test_malformed_replies_are_refused(data: str) -> None:
    with pytest.raises(ControlProtocolError):
        parse_server_message(data)


def test_a_status_crosses_the_wire_typed_and_keeps_its_keys() -> None:
    status = NodeStatus(state="paused", paused_by="you", round=3, peers=2, model="seed", swarm={"links": 1},
                        recent=recent_summary([(1.0, 0.5), (61.0, 0.7)], now=61.0), threads={"threads": 2})
    wire = json.loads(encode_result(1, status_to_wire(status)))["result"]
    assert {"state", "paused_by", "detail", "round", "policy_version", "peers", "model", "model_name", "device",
            "backend", "peer_name", "data_dir", "recent", "last_crash"} <= set(wire)  # `sapo status --json`'s
    assert status_from_wire(wire) == status
    assert status_from_wire({"state": "solo", "from_a_newer_engine": [1]}) == NodeStatus(state="solo")
    with pytest.raises(ValueError, match="round"):  # a node bug is refused before it is sent
        status_to_wire(NodeStatus(round="3"))  # type: ignore[arg-type]
    with pytest.raises(ControlProtocolError, match="state"):
        status_from_wire({"state": "dancing"})
