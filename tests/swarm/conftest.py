"""Fixtures for the swarm tests."""

from __future__ import annotations

import pytest

from engine.swarm.identity import Identity


@pytest.fixture
def alice() -> Identity:
    return Identity.generate()


@pytest.fixture
def bob() -> Identity:
    return Identity.generate()
