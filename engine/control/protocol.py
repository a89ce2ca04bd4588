"""Control API messages, sans-I/O: parse and validate what arrives, encode what leaves.

Client -> server, one JSON object per websocket text frame:
    {"id": 7, "method": "pause", "params": {"after_round": true}}
Server -> client:
    {"id": 7, "result": ...}  or  {"id": 7, "error": {"code": -32602, "message": "..."}}
    {"event": {"type": "round_completed", ...}}     (pushed after a `subscribe` request)
The first request on a connection must be {"method": "auth", "params": {"token": "..."}}; a missing
or wrong token gets an error and the connection is closed. Everything is validated here (sizes,
types, finite numbers, known methods and parameters), so the glue never sees a malformed request.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from engine.control.status import NodeStatus
from engine.errors import SapoError
from engine.events import Event, EventError, event_from_dict

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024  # a request is small; settings changes are the largest
MAX_REPLY_BYTES = 32 * 1024 * 1024  # history replies carry rollout texts
MAX_ID_LEN = 64
MAX_TOKEN_LEN = 256
MAX_SETTINGS_KEYS = 64
MAX_SETTING_STR = 1024
MAX_SNOOZE_S = 7 * 24 * 3600.0
MAX_HISTORY_LIMIT = 100_000
MAX_QUESTION_CHARS = 500  # a typed question ("Try it", engine/node/ask.py): a prompt, not a document
MAX_SPECIALTY_CHARS = 64


class ErrorCode(IntEnum):
    PARSE_ERROR = -32700  # not JSON, too large, not UTF-8
    INVALID_REQUEST = -32600  # JSON but not a request object
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL = -32603  # the node raised something unexpected
    UNAUTHORIZED = -32001  # missing or wrong token, or a request before `auth`
    NOT_SUPPORTED = -32002  # an optional method this engine does not offer
    REJECTED = -32003  # the node refused the request (ValueError), e.g. an invalid setting


class ControlProtocolError(SapoError):
    """A request that cannot be served; becomes an error reply (and, before auth, a close)."""

    def __init__(self, code: ErrorCode, message: str, request_id: int | str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    id: int | str | None
    method: str
    params: dict[str, Any] = field(default_factory=dict)


# --- parameter checks: each returns the cleaned value or raises ValueError -------------------------

def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")  # noqa: TRY004 (ValueError for every bad input)
    return value


def _number(lo: float, hi: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number")  # noqa: TRY004 (ValueError for every bad input)
        number = float(value)
        if not math.isfinite(number) or not lo <= number <= hi:
            raise ValueError(f"must be a finite number in [{lo:g}, {hi:g}]")
        return number
    return check


def _integer(lo: int, hi: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"must be an integer in [{lo}, {hi}]")
        return value
    return check


def _string(max_len: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not 1 <= len(value) <= max_len:
            raise ValueError(f"must be a string of 1 to {max_len} characters")
        return value
    return check


def _optional_string(max_len: int) -> Callable[[Any], str]:
    """A string of at most `max_len` characters; "" means "not given"."""
    def check(value: Any) -> str:
        if not isinstance(value, str) or len(value) > max_len:
            raise ValueError(f"must be a string of at most {max_len} characters")
        return value
    return check


def _settings_changes(value: Any) -> dict[str, Any]:
    """Shallow checks only (the node's ContributorSettings validates meaning)."""
    if not isinstance(value, dict) or len(value) > MAX_SETTINGS_KEYS:
        raise ValueError(f"must be an object with at most {MAX_SETTINGS_KEYS} keys")
    for key, item in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 64:
            raise ValueError("keys must be short strings")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{key} must be finite")
        if isinstance(item, str) and len(item) > MAX_SETTING_STR:
            raise ValueError(f"{key} is too long")
        if not isinstance(item, (bool, int, float, str)):
            raise ValueError(f"{key} must be a boolean, number or string")  # noqa: TRY004 (ValueError for every bad input)
    return dict(value)


# method -> {param: (check, default)}; a default of `_REQUIRED` means the caller must send it.
_REQUIRED = object()
METHODS: dict[str, dict[str, tuple[Callable[[Any], Any], Any]]] = {
    "auth": {"token": (_string(MAX_TOKEN_LEN), _REQUIRED)},
    "ping": {},
    "status": {},
    "join": {},
    "leave": {},
    "pause": {"after_round": (_bool, True)},
    "resume": {},  # a node that is not training (started paused, finished) joins
    "finish": {},  # optional: the round in flight finishes, then training stops; the engine stays up
    "snooze": {"seconds": (_number(1.0, MAX_SNOOZE_S), _REQUIRED)},
    "get_settings": {},
    "update_settings": {"changes": (_settings_changes, _REQUIRED)},
    "history": {"limit": (_integer(1, MAX_HISTORY_LIMIT), 2000)},
    "machine": {},
    # "Try it": a question answered by the policy and the starting model between rounds (engine.node.ask).
    "ask": {"specialty": (_optional_string(MAX_SPECIALTY_CHARS), ""),
            "text": (_optional_string(MAX_QUESTION_CHARS), "")},
    "subscribe": {"replay": (_bool, True)},
    "unsubscribe": {},
    # Optional node features: served when the node has the attribute, else NOT_SUPPORTED.
    "select_model": {"model_id": (_string(128), _REQUIRED)},
    "recent_groups": {},  # the node's own last groups (question, completions, rewards)
    "shutdown": {},
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _loads(data: str | bytes, max_bytes: int) -> Any:
    if len(data) > max_bytes:
        raise ControlProtocolError(ErrorCode.PARSE_ERROR, f"message larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ControlProtocolError(ErrorCode.PARSE_ERROR, f"not valid JSON: {exc}") from None


def parse_request(data: str | bytes) -> Request:
    """Validate one client frame; raises ControlProtocolError with the request id when it is known."""
    obj = _loads(data, MAX_REQUEST_BYTES)
    if not isinstance(obj, dict):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "a request must be a JSON object")
    request_id = obj.get("id")
    if request_id is not None and not (
        (isinstance(request_id, int) and not isinstance(request_id, bool) and abs(request_id) < 2**53)
        or (isinstance(request_id, str) and len(request_id) <= MAX_ID_LEN)
    ):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "id must be an integer or a short string")
    unknown = set(obj) - {"id", "method", "params"}
    if unknown:
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, f"unknown fields {sorted(unknown)}", request_id)
    method = obj.get("method")
    if not isinstance(method, str):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "method must be a string", request_id)
    if method not in METHODS:
        raise ControlProtocolError(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method[:64]!r}", request_id)
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise ControlProtocolError(ErrorCode.INVALID_PARAMS, "params must be an object", request_id)
    spec = METHODS[method]
    extra = set(params) - set(spec)
    if extra:
        raise ControlProtocolError(ErrorCode.INVALID_PARAMS, f"{method}: unknown params {sorted(extra)}", request_id)
    clean: dict[str, Any] = {}
    for name, (check, default) in spec.items():
        if name not in params:
            if default is _REQUIRED:
                raise ControlProtocolError(ErrorCode.INVALID_PARAMS, f"{method}: {name} is required", request_id)
            clean[name] = default
            continue
        try:
            clean[name] = check(params[name])
        except ValueError as exc:
            raise ControlProtocolError(ErrorCode.INVALID_PARAMS, f"{method}: {name} {exc}", request_id) from None
    return Request(request_id, method, clean)


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison, so response timing does not leak how much of a guess was right."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def _dumps(obj: Any) -> str:
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


def encode_request(request_id: int | str | None, method: str, params: dict[str, Any] | None = None) -> str:
    return _dumps({"id": request_id, "method": method, "params": params or {}})


def encode_result(request_id: int | str | None, result: Any) -> str:
    """Raises ValueError when `result` holds a non-finite number or a non-JSON type."""
    try:
        return _dumps({"id": request_id, "result": result})
    except TypeError as exc:
        raise ValueError(f"result is not JSON: {exc}") from exc


def encode_error(request_id: int | str | None, code: ErrorCode, message: str) -> str:
    return _dumps({"id": request_id, "error": {"code": int(code), "message": message[:1000]}})


def encode_event(event: Event) -> str:
    return _dumps({"event": event.to_dict()})


# --- the client's side: server frames are untrusted too (`sapo gui --engine URL`) -------------------

@dataclass(frozen=True)
class Reply:
    id: int | str | None
    result: Any = None
    error_code: int | None = None
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.error_code is None


def parse_server_message(data: str | bytes, max_bytes: int = MAX_REPLY_BYTES) -> Reply | Event:
    """A reply or a pushed event; raises ControlProtocolError (or EventError, a ValueError) when malformed."""
    obj = _loads(data, max_bytes)
    if not isinstance(obj, dict):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "server message must be an object")
    if "event" in obj:
        try:
            event = event_from_dict(obj["event"])
        except EventError:
            raise
        except (TypeError, ValueError) as exc:  # an event's own checks
            raise EventError(str(exc)) from exc
        check_event_types(event)
        return event
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, (int, str)):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "reply id must be an integer or a string")
    if "error" in obj:
        err = obj["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int) \
                or not isinstance(err.get("message"), str):
            raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "malformed error reply")
        return Reply(request_id, None, err["code"], err["message"][:1000])
    if "result" not in obj:
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "reply has neither result nor error")
    return Reply(request_id, obj["result"])


_HINTS: dict[str, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    key = f"{cls.__module__}.{cls.__qualname__}"
    if key not in _HINTS:
        # Empty locals: the class namespace would shadow the builtin `type` with the Event.type property.
        _HINTS[key] = typing.get_type_hints(cls, localns={})
    return _HINTS[key]


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        return isinstance(value, dict) and all(
            _conforms(k, key_hint) and _conforms(v, value_hint) for k, v in value.items())
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:  # e.g. a rollout's status: one of the named strings, nothing else
        return isinstance(value, str) and value in typing.get_args(hint)
    return False  # a field type this check does not know: refuse rather than trust


def check_event_types(event: Event) -> None:
    """`event_from_dict` checks names; this checks each field's JSON type against its annotation."""
    hints = _hints(type(event))
    for f in dataclasses.fields(event):
        if not _conforms(getattr(event, f.name), hints[f.name]):
            raise EventError(f"{event.type}.{f.name} has the wrong type")


# --- the node's status: typed on both sides, the field names as wire keys ---------------------------

_COUNTERS = ("round", "policy_version", "peers")


def _status_errors(fields: dict[str, Any]) -> list[str]:
    hints = _hints(NodeStatus)
    bad = [name for name, value in fields.items() if not _conforms(value, hints[name])]
    bad += [name for name in _COUNTERS if name in fields and name not in bad and not 0 <= fields[name] < 2**53]
    return bad


def status_to_wire(status: NodeStatus) -> dict[str, Any]:
    """The `status` reply's result: every field under its name. Raises ValueError when a field does not
    hold its declared type (a node bug, reported as INTERNAL rather than sent; a non-finite number is
    refused by `encode_result`, and by the client's JSON parser)."""
    wire = dataclasses.asdict(status)
    bad = _status_errors(wire)
    if bad:
        raise ValueError(f"status fields of the wrong type: {', '.join(bad)}")
    return wire


def status_from_wire(result: Any) -> NodeStatus:
    """A `status` reply's result (untrusted) -> NodeStatus. A key an older engine does not send takes
    its default and a key a newer one adds is ignored; a field of the wrong type refuses the whole
    reply (ControlProtocolError)."""
    if not isinstance(result, dict):
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, "a status reply must be an object")
    names = {f.name for f in dataclasses.fields(NodeStatus)}
    fields = {name: value for name, value in result.items() if name in names}
    bad = _status_errors(fields)
    if bad:
        raise ControlProtocolError(ErrorCode.INVALID_REQUEST, f"status fields of the wrong type: {', '.join(bad)}")
    return NodeStatus(**fields)
