"""The PnP engine: which events a change makes, for whom, in which order; port-change coalescing.

Every function runs under the manager lock and only queues deliveries on the
manager's PnP queue (:meth:`PnpRegistration.post_event` queues them), so the order
of events is global.  The registrations passed are in delivery order
(:func:`ibal.al.pnp.ordered`): ADDs walk them forwards, REMOVEs backwards.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ibal.al.pnp import DeviceKey, PnpClass, PnpEvent, PnpRegistration, port_state_event
from ibal.types import CaAttr, PortAttr

if TYPE_CHECKING:
    from ibal.al.cica import CiCa

def post(reg: PnpRegistration, event: PnpEvent, key: DeviceKey | None, **fields: Any) -> None:
    """Queue ``event`` for ``reg`` (``fields`` are :class:`PnpRec` fields); port changes
    coalesce (:meth:`PnpRegistration.post_event`)."""
    reg.post_event(event, key, fields)


def _post(reg: PnpRegistration, event: PnpEvent, key: DeviceKey | None, ca_guid: int,
          guid: int, ca_attr: CaAttr | None, port_attr: PortAttr | None) -> None:
    post(reg, event, key, ca_guid=ca_guid, guid=guid, ca_attr=ca_attr, port_attr=port_attr)


def _ca_events(reg: PnpRegistration, cica: CiCa, add: bool) -> None:
    attr = cica.attr
    if reg.pnp_class is PnpClass.CA:
        event = PnpEvent.CA_ADD if add else PnpEvent.CA_REMOVE
        _post(reg, event, ("ca", cica.guid), cica.guid, cica.guid, attr if add else None, None)


def _port_events(reg: PnpRegistration, cica: CiCa, add: bool) -> None:
    attr = cica.attr
    if reg.pnp_class is not PnpClass.PORT:
        return
    for port in attr.ports:
        key = ("port", port.port_guid)
        if add:
            _post(reg, PnpEvent.PORT_ADD, key, cica.guid, port.port_guid, attr, port)
            _post(reg, port_state_event(port), key, cica.guid, port.port_guid, attr, port)
        else:
            _post(reg, PnpEvent.PORT_REMOVE, key, cica.guid, port.port_guid, None, port)


def replay(reg: PnpRegistration, cicas: list[CiCa], done: threading.Event | None) -> None:
    """The current state for a new registration, then ``REG_COMPLETE``."""
    for cica in cicas:
        _ca_events(reg, cica, True)
        _port_events(reg, cica, True)
    reg.manager.io_devices.replay(reg)
    _post(reg, PnpEvent.REG_COMPLETE, None, 0, 0, None, None)
    if done is not None:
        reg.manager.queues.pnp.post(done.set)


def ca_added(regs: list[PnpRegistration], cica: CiCa) -> None:
    """A CA registered: ``CA_ADD`` then its ports, to registrations in order."""
    for reg in regs:
        _ca_events(reg, cica, True)
    for reg in regs:
        _port_events(reg, cica, True)


def ca_removed(regs: list[PnpRegistration], cica: CiCa) -> None:
    """A CA goes: the I/O devices reached through it, its ports, then the CA, each to
    registrations in reverse order."""
    cica.mgr.io_devices.ca_lost(cica.guid, [p.port_guid for p in cica.attr.ports])
    for reg in reversed(regs):
        _port_events(reg, cica, False)
    for reg in reversed(regs):
        _ca_events(reg, cica, False)


def client_reregister(regs: list[PnpRegistration], cica: CiCa, port_num: int) -> None:
    """The SM asked a port's clients to re-register: ``CLIENT_REREGISTER`` to PORT registrations."""
    port = cica.port(port_num)
    if port is None:
        return
    key = ("port", port.port_guid)
    for reg in regs:
        if reg.pnp_class is PnpClass.PORT:
            _post(reg, PnpEvent.CLIENT_REREGISTER, key, cica.guid, port.port_guid, cica.attr, port)


def port_changes(regs: list[PnpRegistration], cica: CiCa, old: CaAttr, new: CaAttr) -> None:
    """Events for what changed between two snapshots of a CA's ports (latest state wins)."""
    old_ports = {p.port_num: p for p in old.ports}
    new_ports = {p.port_num: p for p in new.ports}
    for num, port in new_ports.items():
        before = old_ports.get(num)
        key = ("port", port.port_guid)
        events: list[PnpEvent] = []
        if before is None:
            events = [PnpEvent.PORT_ADD, port_state_event(port)]
        else:
            if port_state_event(before) is not port_state_event(port):
                events.append(port_state_event(port))
                if port_state_event(before) is PnpEvent.PORT_ACTIVE:
                    cica.mgr.io_devices.port_lost(port.port_guid)  # IOC_REMOVE first
            if (before.lid, before.lmc) != (port.lid, port.lmc):
                events.append(PnpEvent.LID_CHANGE)
            if before.pkeys != port.pkeys:
                events.append(PnpEvent.PKEY_CHANGE)
            if (before.sm_lid, before.sm_sl) != (port.sm_lid, port.sm_sl):
                events.append(PnpEvent.SM_CHANGE)
            if before.gids != port.gids:
                events.append(PnpEvent.GID_CHANGE)
            if before.subnet_timeout != port.subnet_timeout:
                events.append(PnpEvent.SUBNET_TIMEOUT_CHANGE)
        for reg in regs:
            if reg.pnp_class is PnpClass.PORT:
                for event in events:
                    _post(reg, event, key, cica.guid, port.port_guid, new, port)
    for num, before in old_ports.items():
        if num not in new_ports:
            cica.mgr.io_devices.port_lost(before.port_guid)
            for reg in reversed(regs):
                if reg.pnp_class is PnpClass.PORT:
                    key = ("port", before.port_guid)
                    _post(reg, PnpEvent.PORT_REMOVE, key, cica.guid, before.port_guid, None, before)


