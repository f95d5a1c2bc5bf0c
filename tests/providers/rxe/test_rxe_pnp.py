"""PnP from the rxe provider: its port follows the veth it is bound to (netlink link events),
seen as PnP events by the access layer's registrations; devices created and removed at run
time are CA_ADD/CA_REMOVE in subsystem order."""

from __future__ import annotations

import ipaddress
import threading

from netns_util import netns
from test_rxe_device import _dummy

from ibal.al import AlManager, PnpClass, PnpEvent, PnpRec
from ibal.providers.rxe.provider import RxeProvider
from ibal.types import LinkState

WAIT = 20.0
E = PnpEvent


class Seen:
    def __init__(self) -> None:
        self.items: list[tuple[PnpEvent, LinkState | None]] = []
        self.cond = threading.Condition()

    def __call__(self, rec: PnpRec) -> None:
        with self.cond:
            state = rec.port_attr.link_state if rec.port_attr is not None else None
            self.items.append((rec.event, state))
            self.cond.notify_all()

    def wait_for(self, event: PnpEvent) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: any(e is event for e, _ in self.items), WAIT), \
                self.items


def test_port_follows_the_veth_down_and_up_as_pnp_events() -> None:
    with netns() as ns:
        _dummy(ns, "veth0")
        mgr = AlManager()
        with ns.entered():
            provider = RxeProvider({"devices": "rxe0=veth0"})
            mgr.add_provider(provider)
        try:
            al = mgr.open_al()
            seen = Seen()
            al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, seen)
            assert seen.items[0][0] is E.PORT_ADD
            assert seen.items[2] == (E.REG_COMPLETE, None)
            # ACTIVE once the veth has carrier, which the kernel may report a moment after
            # "up": replayed, or a live PORT_ACTIVE after a replayed PORT_DOWN.
            seen.wait_for(E.PORT_ACTIVE)
            seen.items.clear()
            ns.ip("link", "set", "veth0", "down")  # administratively down
            seen.wait_for(E.PORT_DOWN)
            ns.ip("link", "set", "veth0", "up")
            seen.wait_for(E.PORT_ACTIVE)
            assert [s for s in seen.items if s[0] in (E.PORT_DOWN, E.PORT_ACTIVE)] == [
                (E.PORT_DOWN, LinkState.DOWN), (E.PORT_ACTIVE, LinkState.ACTIVE)]
            seen.items.clear()
            ns.ip("link", "set", "veth0p", "down")  # the peer: carrier lost
            seen.wait_for(E.PORT_DOWN)
            assert al.query_ca_by_guid(mgr.ca_guids[0]).ports[0].link_state is LinkState.DOWN
            ns.ip("link", "set", "veth0p", "up")
            seen.wait_for(E.PORT_ACTIVE)
            assert [e for e, _ in seen.items if e in (E.PORT_DOWN, E.PORT_ACTIVE)] == [
                E.PORT_DOWN, E.PORT_ACTIVE]
            ca_seen = Seen()
            al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, ca_seen)
            seen.items.clear()
            ns.ip("link", "del", "veth0")  # the device goes with its interface
            ca_seen.wait_for(E.CA_REMOVE)
            # the kernel may report the link down before it is gone
            assert [e for e, _ in seen.items] in ([E.PORT_REMOVE], [E.PORT_DOWN, E.PORT_REMOVE])
            assert mgr.ca_guids == []
            al.close()
        finally:
            mgr.close(timeout=WAIT)


def test_devices_added_and_removed_at_run_time_reach_pnp_in_order() -> None:
    from ibal.al import PnpOrder
    from ibal.providers.rxe.device import DeviceSpec

    with netns() as ns:
        _dummy(ns, "veth0")
        ns.ip("link", "add", "veth1", "type", "veth", "peer", "name", "veth1p")
        ns.ip("link", "set", "veth1p", "up")
        ns.ip("link", "set", "veth1", "up")
        ns.ip("addr", "add", "10.2.0.1/24", "dev", "veth1")
        mgr = AlManager()
        with ns.entered():
            provider = RxeProvider({"devices": "rxe0=veth0"})
            mgr.add_provider(provider)
        try:
            al = mgr.open_al()
            order: list[tuple[str, PnpEvent]] = []
            al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC,
                       lambda rec: order.append(("user", rec.event)))
            al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC,
                       lambda rec: order.append(("sa", rec.event)), order=PnpOrder.SA)
            ports = Seen()
            al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, ports)
            order.clear()
            ports.items.clear()
            assert provider.registry is not None
            with ns.entered():  # the device's sockets live in the namespace
                provider.registry.create(DeviceSpec("rxe1", address=ipaddress.ip_address(
                    "10.2.0.1")))
            assert len(mgr.ca_guids) == 2
            assert mgr.queues.flush(WAIT)
            assert order == [("sa", E.CA_ADD), ("user", E.CA_ADD)]
            assert ports.items[0][0] is E.PORT_ADD
            ports.wait_for(E.PORT_ACTIVE)  # at once, or when the new veth gets carrier
            order.clear()
            ports.items.clear()
            provider.registry.remove("rxe1")
            assert order == [("user", E.CA_REMOVE), ("sa", E.CA_REMOVE)]
            assert ports.items == [(E.PORT_REMOVE, LinkState.ACTIVE)]
            assert len(mgr.ca_guids) == 1
            al.close()
        finally:
            mgr.close(timeout=WAIT)
