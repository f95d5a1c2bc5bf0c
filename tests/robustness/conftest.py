"""The ``world`` fixture of the bad-input and fuzz tests (helpers in robust_world.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from robust_world import PROVIDERS, World, close_world_parts, open_world


@pytest.fixture(params=PROVIDERS)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    w = open_world(request.param)
    try:
        yield w
    finally:
        close_world_parts(w.provider, w.mgr)
