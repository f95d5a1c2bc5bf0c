"""``ibal.open_al()`` without arguments: hardware providers only, simulated ones on request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from al_fakes import FakeProvider

import ibal
from ibal.al import AlManager
from ibal.al import manager as manager_mod
from ibal.al.manager import SIMULATED_SKIPPED, start_default_providers
from ibal.ci import ProviderManager, ProviderRegistry, hookimpl
from ibal.providers.mock import MockProvider


class Plugin:
    """A simulated mock registered ahead of a fake "hardware" provider."""

    @hookimpl
    def ibal_register_providers(self, registry: ProviderRegistry) -> None:
        registry.add("amock", MockProvider, "simulated", simulated=True)
        registry.add("hw", lambda opts: FakeProvider(2, base_guid=0x9000), "real adapters")


def plugin_manager() -> ProviderManager:
    pm = ProviderManager(use_entry_points=False)
    pm.add_plugin(Plugin())
    return pm


@pytest.fixture
def mgr() -> Iterator[AlManager]:
    m = AlManager(provider_manager=plugin_manager())
    yield m
    m.close(timeout=10)


def test_default_set_leaves_simulated_providers_out(mgr: AlManager) -> None:
    start_default_providers(mgr)
    al = mgr.open_al()
    guids = al.get_ca_guids()
    assert guids == [0x9000, 0x9100]  # the "hardware" CAs, and nothing simulated
    assert al.open_ca(guids[0]).provider_name == "fake"
    assert mgr.unavailable == {"amock": SIMULATED_SKIPPED}


def test_named_providers_start_simulated_ones_in_the_given_order(mgr: AlManager) -> None:
    start_default_providers(mgr, ["hw", "amock"])
    al = mgr.open_al()
    names = [al.open_ca(g).provider_name for g in al.get_ca_guids()]
    assert names == ["fake", "fake", "mock", "mock"]
    assert mgr.unavailable == {}


def default_al(monkeypatch: pytest.MonkeyPatch, env: str | None) -> Any:
    if env is None:
        monkeypatch.delenv(manager_mod.PROVIDERS_ENV, raising=False)
    else:
        monkeypatch.setenv(manager_mod.PROVIDERS_ENV, env)
    monkeypatch.setattr(manager_mod, "_default", None)
    monkeypatch.setattr(manager_mod.AlManager, "_providers_pm", lambda self: plugin_manager())
    return ibal.open_al()


def test_open_al_gives_the_real_ca_first(monkeypatch: pytest.MonkeyPatch) -> None:
    al = default_al(monkeypatch, None)
    try:
        assert al.get_ca_guids()[0] == 0x9000
        assert al.open_ca(al.get_ca_guids()[0]).provider_name == "fake"
        assert "amock" in al.manager.unavailable
    finally:
        al.close()
        al.manager.close()
        monkeypatch.setattr(manager_mod, "_default", None)


def test_open_al_environment_asks_for_the_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    al = default_al(monkeypatch, "amock")
    try:
        guids = al.get_ca_guids()
        assert guids and al.open_ca(guids[0]).provider_name == "mock"
    finally:
        al.close()
        al.manager.close()
        monkeypatch.setattr(manager_mod, "_default", None)


def test_installed_mock_and_sample_are_simulated() -> None:
    pm = ProviderManager()
    assert pm.spec("mock").simulated
    assert not pm.spec("rdma_core").simulated
    if "sample" in pm.names():
        assert pm.spec("sample").simulated
