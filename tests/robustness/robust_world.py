"""The bad-input and fuzz tests' world: one access layer per provider, two CAs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ibal.al import AccessLayer, AlManager, Ca
from ibal.testing.backdoor import FabricRegistrar
from ibal.testing.helpers import active_port, need_root
from ibal.types import PortAttr

RXE_DEVICES = "rxe_bad0=127.0.0.71,rxe_bad1=127.0.0.72"
PROVIDERS = ("mock", "sample", "rxe")


def make_provider(name: str) -> Any:
    if name == "mock":
        from ibal.providers.mock.provider import MockProvider

        return MockProvider({"cas": 2})
    if name == "sample":
        from ibal_sample_provider.provider import SampleProvider

        return SampleProvider({})
    need_root()
    from ibal.providers.rxe.provider import RxeProvider

    return RxeProvider({"devices": RXE_DEVICES})


@dataclass
class World:
    """An AL over one provider's two CAs (traced: ``registrar.traced[guid]``)."""

    name: str
    provider: Any
    mgr: AlManager
    registrar: FabricRegistrar
    al: AccessLayer
    ca0: Ca
    p0: PortAttr
    ca1: Ca
    p1: PortAttr


def open_world(name: str) -> World:
    mgr = AlManager()
    registrar = FabricRegistrar(mgr, trace=True)
    provider = make_provider(name)
    try:
        provider.start(registrar)
        al = mgr.open_al()
        cas = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
        p0, p1 = active_port(cas[0].query().ports), active_port(cas[-1].query().ports)
        assert p0 is not None and p1 is not None
    except BaseException:
        close_world_parts(provider, mgr)
        raise
    return World(name, provider, mgr, registrar, al, cas[0], p0, cas[-1], p1)


def close_world_parts(provider: Any, mgr: AlManager) -> None:
    try:
        provider.stop()
    finally:
        mgr.close(timeout=20)
