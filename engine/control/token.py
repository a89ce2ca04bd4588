"""The control token and the discovery file, both in the data dir.

`control.token`: secrets.token_urlsafe(32), file mode 0600, renewed at every engine start, so a token
copied out of an old data dir stops working. `control.json`: {"url", "pid"} of the running engine so
`sapo gui` can find it; removed when the engine stops (and ignored when its pid is gone).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import SapoError

TOKEN_FILE = "control.token"
INFO_FILE = "control.json"
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{16,256}$")
_URL_RE = re.compile(r"^wss?://[A-Za-z0-9.\-\[\]:]{1,255}(/[\x21-\x7e]{0,255})?$")
MAX_INFO_BYTES = 4096


class TokenError(SapoError, RuntimeError):
    """No usable token: the engine is not running here, or the file was tampered with."""


def _write_private(path: Path, text: str) -> None:
    """Write via a 0600 temp file and rename: the secret is never readable by others, even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if hasattr(os, "fchmod"):  # the umask cannot widen 0600, but an existing file keeps its mode
            os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_token(data_dir: Path) -> str:
    """A fresh random token written to `data_dir/control.token` (mode 0600)."""
    token = secrets.token_urlsafe(32)
    _write_private(Path(data_dir) / TOKEN_FILE, token + "\n")
    return token


def validate_token(token: str) -> str:
    token = token.strip()
    if not _TOKEN_RE.match(token):
        raise TokenError("control token must be 16-256 URL-safe characters")
    return token


def read_token(data_dir: Path) -> str:
    path = Path(data_dir) / TOKEN_FILE
    try:
        if path.stat().st_size > 1024:
            raise TokenError(f"{path} is too large to be a token")
        return validate_token(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokenError(f"no control token at {path}: is the engine running with --control?") from None


@dataclass(frozen=True)
class ControlInfo:
    url: str  # ws://127.0.0.1:PORT of the engine's control server
    pid: int  # the engine's process id

    @classmethod
    def from_dict(cls, data: Any) -> ControlInfo:
        if not isinstance(data, dict):
            raise ValueError("control info must be an object")  # noqa: TRY004 (ValueError for every bad input)
        url, pid = data.get("url"), data.get("pid")
        if not isinstance(url, str) or not _URL_RE.match(url):
            raise ValueError("control info url must be a ws:// URL")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
            raise ValueError("control info pid must be a positive integer")
        return cls(url, pid)


def write_control_info(data_dir: Path, url: str, pid: int | None = None) -> ControlInfo:
    info = ControlInfo.from_dict({"url": url, "pid": os.getpid() if pid is None else pid})
    _write_private(Path(data_dir) / INFO_FILE, json.dumps({"url": info.url, "pid": info.pid}) + "\n")
    return info


def read_control_info(data_dir: Path) -> ControlInfo | None:
    """The engine's address, or None when there is no file or it is unreadable or malformed."""
    path = Path(data_dir) / INFO_FILE
    try:
        if path.stat().st_size > MAX_INFO_BYTES:
            return None
        return ControlInfo.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def remove_control_info(data_dir: Path, pid: int | None = None) -> None:
    """Remove control.json if it still names `pid` (default: this process), not a newer engine's."""
    info = read_control_info(data_dir)
    if info is not None and info.pid == (os.getpid() if pid is None else pid):
        (Path(data_dir) / INFO_FILE).unlink(missing_ok=True)
