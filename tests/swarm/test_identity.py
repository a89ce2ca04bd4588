"""Identity: key created once with mode 0600, stable id and name, copies detected."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from engine.swarm.errors import IdentityError
from engine.swarm.identity import KEY_FILE, Identity, b64url_decode, is_peer_id, name_for, verify


def test_created_once_with_private_mode(tmp_path: Path) -> None:
    first = Identity.load_or_create(tmp_path / "data")
    path = tmp_path / "data" / KEY_FILE
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(tmp_path / "data")
    assert again.peer_id == first.peer_id and again.name == first.name
    assert again.instance != first.instance  # one per process start
    assert len(first.peer_id) == 43 and is_peer_id(first.peer_id)


def test_name_is_adjective_animal_and_deterministic() -> None:
    ident = Identity.generate()
    assert name_for(ident.peer_id) == ident.name
    adjective, animal = ident.name.split("-")
    assert adjective.isalpha() and animal.isalpha()
    names = {Identity.generate().name for _ in range(40)}
    assert len(names) > 20  # spread, not one constant


def test_sign_and_verify() -> None:
    ident, other = Identity.generate(), Identity.generate()
    sig = ident.sign(b"payload")
    assert verify(ident.peer_id, sig, b"payload")
    assert not verify(ident.peer_id, sig, b"payload!")
    assert not verify(other.peer_id, sig, b"payload")
    assert not verify("not-an-id", sig, b"payload")
    assert not verify(ident.peer_id, sig[:63], b"payload")


def test_b64url_is_strict() -> None:
    ident = Identity.generate()
    assert b64url_decode(ident.peer_id, 32) is not None
    assert b64url_decode(ident.peer_id + "A", 32) is None
    assert b64url_decode(ident.peer_id[:-1] + "+", 32) is None  # not the url-safe alphabet
    assert b64url_decode("A" * 42 + "B", 32) is None  # stray low bits: a non-canonical spelling


def test_copied_data_dir_shares_the_id(tmp_path: Path) -> None:
    original = Identity.load_or_create(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = Identity.load_or_create(tmp_path / "b")
    # Same key, same id: what the protocol's DuplicateIdentity check (hello instance) then detects.
    assert copy.peer_id == original.peer_id and copy.instance != original.instance


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_loose_mode_is_tightened(tmp_path: Path) -> None:
    Identity.load_or_create(tmp_path)
    path = tmp_path / KEY_FILE
    os.chmod(path, 0o644)
    Identity.load_or_create(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_corrupt_key_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="move it away"):
        Identity.load_or_create(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"x" * 10000)
    with pytest.raises(IdentityError, match="too large"):
        Identity.load_or_create(tmp_path)
