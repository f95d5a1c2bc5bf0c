"""Fixtures for the access layer's own tests: a manager over fake CAs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AccessLayer, AlManager, Ca, Cq, Pd


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(2)


@pytest.fixture
def mgr(provider: FakeProvider) -> Iterator[AlManager]:
    m = AlManager()
    m.add_provider(provider)
    yield m
    m.close(timeout=10)


@pytest.fixture
def ci(provider: FakeProvider) -> FakeCi:
    return provider.cis[0]


@pytest.fixture
def al(mgr: AlManager) -> AccessLayer:
    return mgr.open_al()


@pytest.fixture
def ca(al: AccessLayer, ci: FakeCi) -> Ca:
    return al.open_ca(ci.guid)


@pytest.fixture
def pd(ca: Ca) -> Pd:
    return ca.alloc_pd()


@pytest.fixture
def cq(ca: Ca) -> Cq:
    return ca.create_cq(64)
