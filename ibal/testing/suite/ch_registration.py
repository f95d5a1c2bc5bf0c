"""Chapter: CA registration, deregistration, hot-plug and PnP notification."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from ibal.al import PnpClass, PnpEvent, PnpRec
from ibal.status import (
    DuplicateCa,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidParameter,
    InvalidPdHandle,
    NotFound,
    Status,
    Unsupported,
)
from ibal.testing.backdoor import TracingCi
from ibal.testing.helpers import CallbackLog, Source, active_port, wait_wcs
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, Fabric, require, traced
from ibal.types import AsyncEvent, EventRecord, LinkState, PortAttr

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Ca


class PnpLog(CallbackLog):
    """A PnP callback recording ``(tag, event, guid, record)``; ``answer`` is what it returns."""

    def __init__(
        self, tag: str = "", shared: list[tuple[str, Any]] | None = None, answer: Any = None
    ) -> None:
        super().__init__()
        self.tag = tag
        self.shared = shared
        self.answer = answer

    def __call__(self, *args: Any) -> Any:
        rec: PnpRec = args[0]
        if self.shared is not None:
            self.shared.append((self.tag, rec.event))
        self.add(rec.event, rec.guid, rec)
        return self.answer

    def events(self) -> list[Any]:
        return [e[0] for e in self.snapshot()]


class RegistrationChecks(ConformanceBase):
    chapter = "registration, hot-plug & PnP"

    # ------------------------------------------------------------ register / deregister
    @rules("ci:1")
    def test_register_none_raises_invalid_parameter(self, fabric: Fabric) -> None:
        """ci-contract rule 1: ib_register_ca(None) → IB_INVALID_PARAMETER."""
        with pytest.raises(InvalidParameter):
            fabric.manager.register_ca(None)  # type: ignore[arg-type]

    @rules("ci:2")
    def test_register_same_guid_raises_duplicate_ca(self, fabric: Fabric) -> None:
        """ci-contract rule 2: registering a GUID that is registered → IB_DUPLICATE_CA."""
        guid, ci = next(iter(fabric.registrar.raw.items()))
        with pytest.raises(DuplicateCa):
            fabric.manager.register_ca(ci)
        assert guid in fabric.manager.open_al().get_ca_guids()

    @rules("ci:4")
    def test_register_other_version_raises_unsupported(self, fabric: Fabric) -> None:
        """ci-contract rule 4 / decisions: an interface of another contract version →
        IB_UNSUPPORTED."""
        from ibal.al import AlManager

        ci = next(iter(fabric.registrar.raw.values()))
        other = AlManager()
        try:
            with pytest.raises(Unsupported):
                other.register_ca(TracingCi(ci, version=ci.version + 1))
            assert other.open_al().get_ca_guids() == []
        finally:
            other.close()

    @rules("ci:5")
    def test_deregister_unknown_guid_raises_not_found(self, fabric: Fabric) -> None:
        """ci-contract rule 5: ib_deregister_ca of an unregistered GUID → IB_NOT_FOUND."""
        with pytest.raises(NotFound):
            fabric.manager.deregister_ca(max(fabric.registrar.raw) + 0x777)

    @rules("ci:6")
    @traced
    def test_deregister_frees_everything_then_closes(
        self, fabric: Fabric, ca: Ca, port: PortAttr
    ) -> None:
        """ci-contract rule 6: deregistration destroys each resource through the provider, then
        close_ca."""
        tr = fabric.traced(ca.guid)
        Source(ca, port)
        made = tr.succeeded()
        creates = {
            "allocate_pd": "deallocate_pd",
            "create_cq": "destroy_cq",
            "create_qp": "destroy_qp",
            "register_mr": "deregister_mr",
        }
        counts = {k: sum(1 for c in made if c.name == k) for k in creates}
        tr.clear()
        fabric.registrar.deregister_ca(ca.guid)
        calls = tr.succeeded()
        names = [c.name for c in calls]
        for create, destroy in creates.items():
            assert names.count(destroy) == counts[create], f"{destroy}: {names}"
        assert names[-1] == "close_ca"

    @rules("ci:7")
    def test_deregistration_leaves_no_provider_resources(
        self, fabric: Fabric, ca: Ca, port: PortAttr
    ) -> None:
        """ci-contract rule 7: after ib_deregister_ca the provider holds no resource of that CA."""
        Source(ca, port)
        assert any(self.resources_of(fabric, ca.guid).values())
        fabric.registrar.deregister_ca(ca.guid)
        assert not any(self.resources_of(fabric, ca.guid).values())

    @rules("doc:ci-contract §3.4", "doc:decisions")
    def test_deregistered_ca_handles_invalid(self, fabric: Fabric, al: AccessLayer, ca: Ca) -> None:
        """ci-contract §3.4 / decisions: after deregistration the CA is gone and its handles
        invalid."""
        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        fabric.registrar.deregister_ca(ca.guid)
        assert ca.guid not in al.get_ca_guids()
        with pytest.raises(InvalidCaHandle):
            ca.query()
        with pytest.raises(InvalidPdHandle):
            pd.create_mw()
        with pytest.raises(InvalidCqHandle):
            cq.poll()

    @rules("ci:7", "ci:16")
    def test_reregister_after_deregister(self, fabric: Fabric, al: AccessLayer) -> None:
        """ci-contract rules 7, 16: a withdrawn CA registers again and moves data."""
        self.require_reregistration()
        guid = al.get_ca_guids()[0]
        fabric.registrar.deregister_ca(guid)
        fabric.registrar.reannounce(guid)
        assert guid in al.get_ca_guids()
        ca = al.open_ca(guid)
        port = active_port(ca.query().ports)
        assert port is not None
        src = Source(ca, port)
        ids = src.fire(2)
        assert [w.wr_id for w in wait_wcs(src.send_cq, 2)] == ids

    # ------------------------------------------------------------ PnP
    @rules("al:112")
    def test_pnp_replays_cas_then_reg_complete(self, al: AccessLayer) -> None:
        """access-layer rule 112: registration replays one CA_ADD per CA, then REG_COMPLETE."""
        log = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_COMPLETE, log, context="pnp-ctx")
        guids = al.get_ca_guids()
        log.wait(len(guids) + 1)
        entries = log.snapshot()
        assert [e[0] for e in entries] == [PnpEvent.CA_ADD] * len(guids) + [PnpEvent.REG_COMPLETE]
        assert sorted(e[1] for e in entries[:-1]) == sorted(guids)
        for _, guid, rec in entries[:-1]:
            assert rec.ca_guid == guid and rec.ca_attr is not None and rec.ca_attr.ca_guid == guid
            assert rec.pnp_context == "pnp-ctx" and rec.context is None

    @rules("al:112")
    def test_pnp_port_add_followed_by_state(self, al: AccessLayer) -> None:
        """access-layer rule 112: each PORT_ADD is followed by an event stating the port's state."""
        state_event = {
            LinkState.ACTIVE: PnpEvent.PORT_ACTIVE,
            LinkState.DOWN: PnpEvent.PORT_DOWN,
            LinkState.INIT: PnpEvent.PORT_INIT,
            LinkState.ARMED: PnpEvent.PORT_ARMED,
        }
        ports = [p for g in al.get_ca_guids() for p in al.query_ca_by_guid(g).ports]
        log = PnpLog()
        al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_COMPLETE, log)
        log.wait(2 * len(ports) + 1)
        entries = log.snapshot()
        assert entries[-1][0] is PnpEvent.REG_COMPLETE
        by_guid: dict[int, list[Any]] = {}
        for event, guid, _ in entries[:-1]:
            by_guid.setdefault(guid, []).append(event)
        for p in ports:
            assert by_guid[p.port_guid] == [
                PnpEvent.PORT_ADD,
                state_event.get(p.link_state, PnpEvent.PORT_DOWN),
            ]
        assert all(rec.port_attr is not None for _, _, rec in entries[:-1])

    @rules("al:112")
    def test_pnp_reg_sync_returns_after_replay(self, al: AccessLayer) -> None:
        """access-layer rule 112: with FLAG_REG_SYNC, reg_pnp returns after the replay was
        delivered."""
        log = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log)
        assert len(log) >= len(al.get_ca_guids())

    @rules("al:112")
    def test_pnp_one_class_per_registration(self, al: AccessLayer) -> None:
        """access-layer rule 112: only one class may be given → else IB_INVALID_PARAMETER."""
        with pytest.raises(InvalidParameter):
            al.reg_pnp(PnpClass.CA | PnpClass.PORT, PnpLog())

    @rules("al:112")
    def test_pnp_record_names_its_registration(self, al: AccessLayer) -> None:
        """access-layer rule 112: the record's h_pnp is the handle reg_pnp returned."""
        log = PnpLog()
        reg = al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log)
        assert all(e[2].registration is reg for e in log.snapshot())

    @rules("al:112", "al:114")
    def test_pnp_dereg_is_a_fence(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rules 112, 114: after dereg returns no callback runs;
        destroy_cb(pnp_context) once."""
        log = PnpLog()
        reg = al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log, context="ctx")
        done = CallbackLog()
        reg.dereg(done)
        seen = len(log)
        done.wait(1)
        fabric.registrar.deregister_ca(al.get_ca_guids()[0])
        witness = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, witness)  # a later PnP-queue round
        assert len(log) == seen
        assert done.snapshot() == [("ctx",)]

    @rules("al:112")
    def test_pnp_device_context_kept_until_remove(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 112: a context stored by the callback comes back with later events."""
        token = object()

        def cb(rec: PnpRec) -> None:
            log(rec)
            if rec.event is PnpEvent.CA_ADD:
                rec.context = token

        log = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, cb)
        guid = al.get_ca_guids()[0]
        fabric.registrar.deregister_ca(guid)
        log.wait_for(lambda es: any(e[0] is PnpEvent.CA_REMOVE for e in es), "CA_REMOVE")
        removes = [e[2] for e in log.snapshot() if e[0] is PnpEvent.CA_REMOVE]
        assert removes[0].guid == guid and removes[0].context is token

    @rules("al:112")
    def test_pnp_rejecting_callback_gets_no_more_events(
        self, fabric: Fabric, al: AccessLayer
    ) -> None:
        """access-layer rule 112: a callback that does not return success hears nothing more of that
        device."""
        refusing = PnpLog(answer=Status.ERROR)
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, refusing)
        witness = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, witness)
        guid = al.get_ca_guids()[0]
        fabric.registrar.deregister_ca(guid)
        witness.wait_for(lambda es: any(e[0] is PnpEvent.CA_REMOVE for e in es), "CA_REMOVE")
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, PnpLog())  # barrier
        assert PnpEvent.CA_REMOVE not in refusing.events()

    @rules("al:112")
    def test_pnp_add_in_order_remove_in_reverse(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 112: ADD events reach registrations in order, REMOVE events in
        reverse."""
        self.require_reregistration()
        order: list[tuple[str, Any]] = []
        first, second = PnpLog("first", order), PnpLog("second", order)
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, first)
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, second)
        order.clear()
        guid = al.get_ca_guids()[0]
        fabric.registrar.deregister_ca(guid)
        fabric.registrar.reannounce(guid)
        second.wait_for(lambda es: len(order) >= 4, "two removes and two adds")
        assert order == [
            ("second", PnpEvent.CA_REMOVE),
            ("first", PnpEvent.CA_REMOVE),
            ("first", PnpEvent.CA_ADD),
            ("second", PnpEvent.CA_ADD),
        ]

    @rules("al:112")
    def test_pnp_ports_removed_before_ca(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 112: a CA removal produces PORT_REMOVE events before CA_REMOVE."""
        order: list[tuple[str, Any]] = []
        cas, ports = PnpLog("ca", order), PnpLog("port", order)
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, cas)
        al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, ports)
        order.clear()
        guid = al.get_ca_guids()[0]
        n_ports = al.query_ca_by_guid(guid).num_ports
        fabric.registrar.deregister_ca(guid)
        cas.wait_for(lambda es: any(e[0] is PnpEvent.CA_REMOVE for e in es), "CA_REMOVE")
        assert order == [("port", PnpEvent.PORT_REMOVE)] * n_ports + [("ca", PnpEvent.CA_REMOVE)]

    @rules("al:112")
    def test_pnp_hotplug_add_reaches_registration(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 112 / design-anchors 6: a CA registered later raises CA_ADD, then its
        ports."""
        self.require_reregistration()
        guid = al.get_ca_guids()[0]
        fabric.registrar.deregister_ca(guid)
        ports = PnpLog()
        al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, ports)
        seen = len(ports)
        fabric.registrar.reannounce(guid)
        n = al.query_ca_by_guid(guid).num_ports
        ports.wait(seen + 2 * n)
        new = ports.events()[seen:]
        assert new[0::2] == [PnpEvent.PORT_ADD] * n
        assert all(e[2].ca_guid == guid for e in ports.snapshot()[seen:])

    @rules("doc:design-anchors")
    @traced
    def test_pnp_port_down_from_provider_event(
        self, fabric: Fabric, al: AccessLayer, ca: Ca, port: PortAttr
    ) -> None:
        """design-anchors 6: a provider's PORT_DOWN event becomes a PnP PORT_DOWN for that port."""
        tr = fabric.traced(ca.guid)
        require(tr.capabilities, "async_event_injection")
        log = PnpLog()
        al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, log)
        seen = len(log)
        tr.inject_async_event(
            EventRecord(AsyncEvent.PORT_DOWN, tr.ca_context, port_num=port.port_num)
        )
        log.wait(seen + 1)
        event, guid, _ = log.snapshot()[seen]
        assert (event, guid) == (PnpEvent.PORT_DOWN, port.port_guid)

    @rules("al:2")
    def test_closed_al_gets_no_more_pnp(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 2: closing the AL ends its PnP registrations."""
        mine = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, mine)
        seen = len(mine)
        guid = al.get_ca_guids()[0]
        al.close()
        other = fabric.manager.open_al()
        try:
            witness = PnpLog()
            other.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, witness)
            fabric.registrar.deregister_ca(guid)
            witness.wait_for(lambda es: any(e[0] is PnpEvent.CA_REMOVE for e in es), "CA_REMOVE")
            assert len(mine) == seen
        finally:
            other.close()

    @rules("doc:access-layer §4.4")
    def test_pnp_callbacks_run_off_callers_thread(self, al: AccessLayer) -> None:
        """access-layer §4.4: PnP callbacks run on a system thread, not the registering one."""
        log = PnpLog()
        al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, log)
        assert log.threads and all(t != threading.get_ident() for t in log.threads)
