"""Fixtures of the mock provider's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mockenv import Node, open_node

from ibal.providers.mock import MockFabric


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    """A two-CA fabric on the manual clock (nothing runs on another thread)."""
    fab = MockFabric(seed=0)
    fab.add_ca()
    fab.add_ca()
    fab.manual_clock()
    yield fab
    fab.close()


@pytest.fixture
def a(fabric: MockFabric) -> Node:
    return open_node(fabric.cas[0])


@pytest.fixture
def b(fabric: MockFabric) -> Node:
    return open_node(fabric.cas[1])
