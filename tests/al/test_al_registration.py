"""register_ca / deregister_ca, the one open CI instance, open_al and the default manager."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

import ibal
from ibal.al import AccessLayer, AlManager, Cq, PnpClass, PnpEvent, PnpRec, QpCreate
from ibal.al import manager as manager_mod
from ibal.status import (
    DuplicateCa,
    InvalidCaHandle,
    InvalidGuid,
    InvalidParameter,
    InvalidPdHandle,
    NotFound,
    Unsupported,
)
from ibal.types import AccessFlags, AvAttr, QpType, Wc, WcType

WAIT = 10.0


def test_register_rejects_non_ci_and_other_versions() -> None:
    with AlManager() as m:
        with pytest.raises(InvalidParameter):
            m.register_ca(object())  # type: ignore[arg-type]
        ci = FakeCi(0x77)
        ci.version = 99
        with pytest.raises(Unsupported):
            m.register_ca(ci)
        assert ci.verbs() == []  # refused before any call into the CI


def test_duplicate_guid_is_refused(mgr: AlManager, ci: FakeCi) -> None:
    with pytest.raises(DuplicateCa):
        mgr.register_ca(FakeCi(ci.guid, "twin"))
    assert ci.guid in mgr.ca_guids


def test_deregister_unknown_guid_is_not_found(mgr: AlManager) -> None:
    with pytest.raises(NotFound):
        mgr.deregister_ca(0xDEAD)


def test_ca_opened_once_and_shared_by_every_al(mgr: AlManager, ci: FakeCi) -> None:
    als = [mgr.open_al() for _ in range(3)]
    cas = [al.open_ca(ci.guid, context=i) for i, al in enumerate(als)]
    assert ci.verbs().count("open_ca") == 1
    assert len({id(c) for c in cas}) == 3
    assert [c.context for c in cas] == [0, 1, 2]


def test_deregister_destroys_everything_through_the_provider_then_closes(
    mgr: AlManager, ci: FakeCi
) -> None:
    al = mgr.open_al()
    ca = al.open_ca(ci.guid)
    pd = ca.alloc_pd()
    cq = ca.create_cq(8)
    pd.create_qp(QpCreate(QpType.RC, cq, cq))
    mr = pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
    pd.create_mw()
    pd.create_av(AvAttr(port_num=1))
    start = len(ci.calls)
    mgr.deregister_ca(ci.guid)
    verbs = [v for v, _ in ci.calls[start:]]
    assert verbs[-1] == "close_ca"
    assert ci.live_kinds() == []  # every resource went back through a destroy verb
    for child, parent in (("destroy_qp", "destroy_cq"), ("destroy_mw", "deregister_mr"),
                          ("deregister_mr", "deallocate_pd"), ("destroy_qp", "deallocate_pd")):
        assert verbs.index(child) < verbs.index(parent)
    with pytest.raises(InvalidCaHandle):
        ca.query()
    with pytest.raises(InvalidPdHandle):
        pd.create_mw()
    del mr
    with pytest.raises(InvalidGuid):
        al.open_ca(ci.guid)
    assert ci.guid not in al.get_ca_guids()
    # The same GUID can come back, and is usable again.
    mgr.register_ca(ci)
    assert al.open_ca(ci.guid).alloc_pd() is not None
    assert ci.verbs().count("open_ca") == 2


def test_pnp_remove_is_delivered_before_the_teardown(mgr: AlManager, ci: FakeCi) -> None:
    al = mgr.open_al()
    ca = al.open_ca(ci.guid)
    pd = ca.alloc_pd()
    seen: list[tuple[PnpEvent, bool]] = []

    def cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_REMOVE and rec.guid == ci.guid:
            # The client still sees valid handles while it is told the CA goes.
            seen.append((rec.event, pd.ca.query() is not None))

    al.reg_pnp(PnpClass.CA, cb)
    mgr.deregister_ca(ci.guid)
    assert seen == [(PnpEvent.CA_REMOVE, True)]


def test_deregister_from_inside_a_callback_completes_after_it(
    mgr: AlManager, ci: FakeCi
) -> None:
    al = mgr.open_al()
    ca = al.open_ca(ci.guid)
    returned = threading.Event()

    def comp_cb(cq: Cq, ctx: Any) -> None:
        mgr.deregister_ca(ci.guid)  # must not wait for the dispatcher it runs on
        returned.set()

    cq = ca.create_cq(8, comp_cb=comp_cb)
    cq.rearm()
    ci.complete(cq._h, Wc(1, WcType.SEND))
    assert returned.wait(WAIT)
    assert mgr.dispatcher.flush(WAIT)
    assert ci.verbs()[-1] == "close_ca"
    assert ci.live_kinds() == []


def test_provider_stop_withdraws_its_cas(provider: FakeProvider) -> None:
    m = AlManager()
    m.add_provider(provider)
    al = m.open_al()
    al.open_ca(provider.cis[1].guid).alloc_pd()
    m.close()
    assert al.closed
    for ci in provider.cis:
        assert ci.live_kinds() == []
        assert ci.ca is None


def test_open_al_with_explicit_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakeProvider] = []

    def create(self: Any, name: str, options: dict[str, Any] | None = None) -> FakeProvider:
        if name != "fake":
            raise NotFound(f"no provider {name}")
        p = FakeProvider(**(options or {}))
        made.append(p)
        return p

    monkeypatch.setattr(manager_mod.ProviderManager, "create", create)
    with ibal.open_al(providers={"fake": {"n": 3}}) as al:
        assert isinstance(al, AccessLayer)
        assert len(al.get_ca_guids()) == 3
        al.open_ca(al.get_ca_guids()[2]).alloc_pd()
    assert made[0].cis[2].live_kinds() == []
    assert made[0].cis[2].ca is None  # the private manager was closed with the AL
    with pytest.raises(NotFound):
        ibal.open_al(providers=["nosuch"])
    with pytest.raises(InvalidParameter):
        ibal.open_al(providers=42)  # type: ignore[arg-type]


def test_default_manager_records_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(manager_mod.PROVIDERS_ENV, "no_such_provider_xyz")
    monkeypatch.setattr(manager_mod, "_default", None)
    al = ibal.open_al()
    try:
        mgr = al.manager
        assert mgr is manager_mod.default_manager()
        assert "no_such_provider_xyz" in mgr.unavailable
        assert al.get_ca_guids() == []
    finally:
        al.close()
        al.manager.close()
        monkeypatch.setattr(manager_mod, "_default", None)


def test_register_may_call_back_into_the_ci_and_pnp_sees_it(mgr: AlManager) -> None:
    al = mgr.open_al()
    added: list[int] = []
    done = threading.Event()

    def cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_ADD:
            added.append(rec.guid)
            done.set()

    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, cb)
    assert len(added) == 2  # the replay was delivered before reg_pnp returned
    added.clear()
    done.clear()
    hot = FakeCi(0x9000, "hot")
    mgr.register_ca(hot)
    assert hot.verbs()[:2] == ["open_ca", "query_ca"]
    assert done.wait(WAIT)
    assert added == [0x9000]
    mgr.deregister_ca(0x9000)
