"""The token and discovery files: private, validated, and ignored when stale."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine.control.launcher import EngineStartError, find_engine, poll_engine, start_engine
from engine.control.token import (
    INFO_FILE,
    TOKEN_FILE,
    TokenError,
    create_token,
    read_control_info,
    read_token,
    remove_control_info,
    write_control_info,
)


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_token_is_random_private_and_renewed(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a permissive umask must not widen the file
    try:
        first = create_token(tmp_path)
        second = create_token(tmp_path)
    finally:
        os.umask(old)
    assert first != second and len(second) >= 40
    assert read_token(tmp_path) == second
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600
    write_control_info(tmp_path, "ws://127.0.0.1:5555")
    assert stat.S_IMODE((tmp_path / INFO_FILE).stat().st_mode) == 0o600


def test_missing_or_garbage_token_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="no control token"):
        read_token(tmp_path)
    (tmp_path / TOKEN_FILE).write_text("not a token!\n")
    with pytest.raises(TokenError):
        read_token(tmp_path)


def test_control_info_validation(tmp_path: Path) -> None:
    info = write_control_info(tmp_path, "ws://127.0.0.1:5555", pid=1234)
    assert read_control_info(tmp_path) == info
    for bad in ('{"url": "http://evil", "pid": 1}', '{"url": "ws://127.0.0.1:1", "pid": -1}',
                '{"url": "ws://127.0.0.1:1", "pid": true}', "[]", "{", '{"url": "ws://a b", "pid": 1}'):
        (tmp_path / INFO_FILE).write_text(bad)
        assert read_control_info(tmp_path) is None, bad


def test_remove_only_removes_our_own_entry(tmp_path: Path) -> None:
    write_control_info(tmp_path, "ws://127.0.0.1:5555", pid=999_999)
    remove_control_info(tmp_path)  # not ours: a newer engine wrote it
    assert read_control_info(tmp_path) is not None
    remove_control_info(tmp_path, pid=999_999)
    assert read_control_info(tmp_path) is None


def test_find_engine_ignores_dead_processes_and_closed_ports(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_control_info(tmp_path, "ws://127.0.0.1:9", pid=dead.pid)
    assert find_engine(tmp_path) is None
    write_control_info(tmp_path, "ws://127.0.0.1:9", pid=os.getpid())  # alive, but nothing listens
    assert find_engine(tmp_path) is None


def test_a_child_engine_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    proc = start_engine(tmp_path, command=[sys.executable, "-c", "import sys; print('model missing'); sys.exit(3)"])
    proc.wait(30)
    with pytest.raises(EngineStartError, match="code 3(.|\n)*model missing"):
        poll_engine(tmp_path, proc)
