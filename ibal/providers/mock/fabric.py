"""``MockFabric``: CAs, ports, switches and links (the engine's clock and lock: ``fabric_view``).

A fabric starts with one subnet switch (``fabric.switch``); every port added
is cabled to it, gets the next unicast LID (from 1, as an SM would hand them
out) and goes ACTIVE.  ``link(a, b)`` recables ports (port to port, port to
another switch, switch to switch); ``set_link(port, up=False)`` takes a link
down, which puts the ports on it DOWN and raises ``PORT_DOWN`` on their CAs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ibal.clock import ManualClock
from ibal.providers.mock import pma
from ibal.providers.mock.agents import MadAgents
from ibal.providers.mock.ca import MOCK_OUI, CaLimits, MockCa
from ibal.providers.mock.ca_state import CaState
from ibal.providers.mock.capture import mock_capture
from ibal.providers.mock.engine import Engine
from ibal.providers.mock.fabric_view import EngineView
from ibal.providers.mock.objects import MockCq, MockQp, MockSrq
from ibal.providers.mock.sm import SubnetManager
from ibal.providers.mock.topology import (
    DEFAULT_SUBNET_PREFIX,
    SWITCH_PORTS,
    Endpoint,
    Link,
    MockPort,
    Switch,
    default_pkeys,
)
from ibal.status import InvalidParameter, ResourceBusy
from ibal.types import AsyncEvent, EventRecord, LinkState

if TYPE_CHECKING:
    from ibal.ci.provider import CaRegistrar

MAX_UNICAST_LID = 0xBFFF

FABRIC_OPTIONS = frozenset(
    {
        "cas",
        "ports",
        "seed",
        "fabric_id",
        "latency",
        "pkeys",
        "violation_counters",
        "manual_clock",
        "clock",
        "limits",
        "subnet_timeout",
        "capture",
    }
)


class MockFabric(EngineView):
    """An in-process InfiniBand subnet: any number of mock CAs and the engine it owns.

    ``seed`` seeds the RNG that probability-based faults draw from; the same
    seed and the same calls give the same outcome.  ``fabric_id`` (default:
    the low 16 bits of the seed) goes into every GUID, so fabrics registered
    with one access layer must differ in it.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        fabric_id: int | None = None,
        latency: float = 0.0,
        subnet_prefix: int = DEFAULT_SUBNET_PREFIX,
        subnet_timeout: int = 18,
        capture: str | None = None,
    ) -> None:
        self.engine = Engine(seed)
        # pcap of every transmitted packet as IB frames (option, else IBAL_CAPTURE)
        self.engine.capture = mock_capture(capture)
        self.fabric_id = (seed if fabric_id is None else fabric_id) & 0xFFFF
        self.engine.latency = float(latency)
        self.subnet_prefix = subnet_prefix
        self.subnet_timeout = subnet_timeout
        self.cas: list[MockCa] = []
        self.switches: list[Switch] = []
        self.links: list[Link] = []
        self.sm_lid = 0
        self.sm = SubnetManager(self)
        self.engine.mad_agents = MadAgents(self)
        self.switch = self.add_switch("sw0")
        self._next_lid = 1
        self._ca_index = 0
        self._registrar: CaRegistrar | None = None
        self._registered: list[MockCa] = []
        self._shared_clock: ManualClock | None = None

    def __repr__(self) -> str:
        return f"<MockFabric seed={self.seed} cas={[c.name for c in self.cas]}>"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MockFabric:
        """A fabric built from provider options (see docs/mock-provider.md)."""
        opts = dict(options)
        limit_names = CaLimits.names()
        unknown = set(opts) - FABRIC_OPTIONS - limit_names
        if unknown:
            known = ", ".join(sorted(FABRIC_OPTIONS | limit_names))
            raise InvalidParameter(f"unknown mock option(s) {sorted(unknown)}; known: {known}")
        limits = dict(opts.pop("limits", None) or {})
        limits.update({k: int(opts.pop(k)) for k in list(opts) if k in limit_names})
        bad = set(limits) - limit_names
        if bad:
            raise InvalidParameter(f"unknown CA limit(s) {sorted(bad)}")
        try:
            fabric = cls(
                int(opts.get("seed", 0)),
                fabric_id=None if opts.get("fabric_id") is None else int(opts["fabric_id"]),
                latency=float(opts.get("latency", 0.0)),
                subnet_timeout=int(opts.get("subnet_timeout", 18)),
                capture=None if opts.get("capture") is None else str(opts["capture"]),
            )
            cas = int(opts.get("cas", 2))
            ports = int(opts.get("ports", 1))
            pkeys = [int(k) for k in opts.get("pkeys", ())]
        except (TypeError, ValueError) as exc:
            raise InvalidParameter(f"bad mock option: {exc}") from None
        if cas < 0 or not 1 <= ports <= 254:
            raise InvalidParameter("cas must be >= 0 and ports 1..254")
        for _ in range(cas):
            fabric.add_ca(
                ports=ports,
                pkeys=pkeys,
                violation_counters=bool(opts.get("violation_counters", True)),
                **limits,
            )
        clock = opts.get("clock")
        if clock is not None:
            if not isinstance(clock, ManualClock):
                raise InvalidParameter(f"'clock' must be an ibal.clock.ManualClock, not {clock!r}")
            fabric.use_clock(clock)
        elif opts.get("manual_clock"):
            fabric.manual_clock()
        return fabric

    # ============================================================ CAs
    def add_ca(
        self,
        name: str | None = None,
        ports: int = 1,
        *,
        pkeys: Iterable[int] = (),
        violation_counters: bool = True,
        connect: bool = True,
        description: str | None = None,
        **limits: int,
    ) -> MockCa:
        """Add a CA with ``ports`` ports; ``limits`` are :class:`CaLimits` fields.

        ``pkeys`` are extra P_Key table entries after 0xFFFF (e.g. ``0x7FFF``
        for limited membership of the default partition).  With
        ``connect=False`` the ports stay unconnected (DOWN).
        """
        bad = set(limits) - CaLimits.names()
        if bad:
            raise InvalidParameter(f"unknown CA limit(s) {sorted(bad)}")
        if not 1 <= ports <= 254:
            raise InvalidParameter("a CA has 1..254 ports")
        extra = [int(k) for k in pkeys]

        def add() -> MockCa:
            index = self._ca_index
            ca_name = name or f"mock{index}"
            if any(c.name == ca_name for c in self.cas):
                raise InvalidParameter(f"a CA called {ca_name!r} exists")
            guid = (MOCK_OUI << 40) | (self.fabric_id << 24) | ((index & 0xFFFF) << 8)
            ca = MockCa(
                self, index, ca_name, guid, CaLimits(**limits),
                violation_counters=violation_counters, description=description,
            )
            for num in range(1, ports + 1):
                port = MockPort(
                    ca, num, guid | num, self._alloc_lid(), default_pkeys(extra),
                    self.subnet_prefix,
                )
                if not self.sm_lid:
                    self.sm_lid = port.lid
                ca.ports.append(port)
                if connect:
                    self._cable(port, self.switch)
            self._ca_index += 1
            self.cas.append(ca)
            self.engine.topology_changed()
            return ca

        return self._locked(add)

    def _alloc_lid(self) -> int:
        used = self.used_lids()
        lid = self._next_lid
        for _ in range(MAX_UNICAST_LID):
            if lid > MAX_UNICAST_LID:
                lid = 1
            if lid not in used:
                self._next_lid = lid + 1
                return lid
            lid += 1
        raise ResourceBusy("no unicast LID left")

    def ca(self, name: str) -> MockCa:
        """The CA called ``name``."""
        for c in self.cas:
            if c.name == name:
                return c
        raise KeyError(name)

    def port(self, ca: MockCa | str, num: int = 1) -> MockPort:
        """Port ``num`` of ``ca`` (an object or a name)."""
        return (self.ca(ca) if isinstance(ca, str) else ca).port(num)

    def ports(self) -> list[MockPort]:
        return [p for c in self.cas for p in c.ports]

    def remove_ca(self, ca: MockCa, *, force: bool = False) -> None:
        """Take ``ca`` off the fabric (it must be closed, and deregistered if it was).

        With ``force`` an open CA is removed too: its ports go DOWN, nothing
        reaches it any more, and its verbs keep working so that whoever still
        has it open can tear down and close it.
        """

        def remove() -> None:
            if ca.opened is not None and not force:
                raise ResourceBusy(f"{ca.name} is still open")
            if ca in self._registered:
                raise ResourceBusy(f"{ca.name} is registered: use hotplug_remove")
            ca.removed = True
            for port in ca.ports:
                port.removed = True
                if port.link is not None:
                    self._uncable(port.link)
                port.state = LinkState.DOWN
            if ca in self.cas:
                self.cas.remove(ca)
            self.engine.topology_changed()

        self._locked(remove)

    # ========================================================== registration
    def attach(self, registrar: CaRegistrar) -> None:
        """Register every CA with ``registrar`` (what ``MockProvider.start`` does)."""
        self.engine.open()
        self._registrar = registrar
        for ca in list(self.cas):
            if ca not in self._registered:
                registrar.register_ca(ca)
                self._registered.append(ca)

    def detach(self) -> None:
        """Deregister every CA registered through ``attach`` (newest first)."""
        registrar = self._registrar
        if registrar is not None:
            for ca in reversed(list(self._registered)):
                registrar.deregister_ca(ca.guid)
                self._registered.remove(ca)
        self._registrar = None

    def hotplug_add(self, name: str | None = None, ports: int = 1, **kwargs: Any) -> MockCa:
        """Add a CA at run time and register it with the attached registrar."""
        ca = self.add_ca(name, ports, **kwargs)
        registrar = self._registrar
        if registrar is not None:
            try:
                registrar.register_ca(ca)
            except BaseException:
                self.remove_ca(ca)
                raise
            self._registered.append(ca)
        return ca

    def hotplug_remove(self, ca: MockCa) -> None:
        """Deregister ``ca`` (the access layer tears its resources down) and remove it."""
        registrar = self._registrar
        if registrar is not None and ca in self._registered:
            registrar.deregister_ca(ca.guid)
            self._registered.remove(ca)
        # A registrar may finish the teardown later (called from its own callback).
        self.remove_ca(ca, force=True)

    # ============================================================== topology
    def add_switch(self, name: str | None = None, ports: int = SWITCH_PORTS) -> Switch:
        """A new switch with ``ports`` external ports; the SM gives it a GUID and a LID."""
        if not 1 <= ports <= 254:
            raise InvalidParameter("a switch has 1..254 ports")
        index = len(self.switches)
        guid = (MOCK_OUI << 40) | (self.fabric_id << 24) | 0xFF0000 | ((index & 0xFF) << 8)
        sw = Switch(name or f"sw{index}", guid, ports)
        sw.lid = self.sm.switch_lid()
        self.switches.append(sw)
        self.engine.topology_changed()
        return sw

    def used_lids(self) -> set[int]:
        """Every LID a CA port (with its LMC range) or a switch holds."""
        used = {lid for p in self.ports() for lid in range(p.lid, p.lid + (1 << p.lmc))}
        used.update(s.lid for s in self.switches)
        return used

    def _cable(self, a: Endpoint, b: Endpoint) -> Link:
        for end in (a, b):
            if isinstance(end, Switch) and not end.free_ports():
                raise ResourceBusy(f"{end.name}: all {end.num_ports} ports are cabled")
        for end in (a, b):
            if isinstance(end, MockPort) and end.link is not None:
                self._uncable(end.link)
        link = Link(a, b, f"{_name(a)}<->{_name(b)}")
        self.links.append(link)
        self._note_link(link)
        for end in (a, b):
            if isinstance(end, MockPort):
                end.link = link
            else:
                num = end.attach(link)
                if end is a:
                    link.pm_a = end.pm[num]
                if end is b:
                    link.pm_b = end.pm[num]
        self.engine.topology_changed()
        for end in (a, b):
            if isinstance(end, MockPort):
                self._set_state(end, LinkState.ACTIVE)
        return link

    def _uncable(self, link: Link) -> None:
        if link in self.links:
            self.links.remove(link)
            self._note_link(link)
        for end in (link.a, link.b):
            if isinstance(end, MockPort):
                if end.link is link:
                    end.link = None
                    self._set_state(end, LinkState.DOWN)
            else:
                end.detach(link)
        self.engine.topology_changed()

    def link(self, a: MockPort | Switch, b: MockPort | Switch) -> Link:
        """Cable ``a`` to ``b``; a port leaves whatever it was cabled to."""
        if a is b:
            raise InvalidParameter("cannot link an endpoint to itself")
        return self._locked(lambda: self._cable(a, b))

    def unlink(self, port: MockPort) -> None:
        """Pull the cable out of ``port`` (it goes DOWN)."""

        def unplug() -> None:
            if port.link is not None:
                self._uncable(port.link)

        self._locked(unplug)

    def set_link(self, target: MockPort | Link, up: bool = True) -> None:
        """Take the link of ``target`` (a port or a link) down or up.

        The ports on it go DOWN (``PORT_DOWN``) or ACTIVE (``PORT_ACTIVE``);
        packets that would cross it are dropped while it is down.
        """

        def apply() -> None:
            link = target if isinstance(target, Link) else target.link
            if link is None:
                raise InvalidParameter(f"{target!r} is not cabled")
            self._set_link_state(link, up)

        self._locked(apply)

    def _set_link_state(self, link: Link, up: bool) -> None:
        if link.up and not up:  # LinkDownedCounter of both ends
            link.pm_a[pma.LINK_DOWNED] += 1
            link.pm_b[pma.LINK_DOWNED] += 1
        link.up = up
        self._note_link(link)
        self.engine.topology_changed()
        for end in (link.a, link.b):
            if isinstance(end, MockPort):
                self._set_state(end, LinkState.ACTIVE if up else LinkState.DOWN)

    def set_port_state(self, port: MockPort, state: LinkState) -> None:
        """Put ``port`` in link ``state`` (any thread): the port event follows.

        Unlike :meth:`set_link` only this end changes (INIT and ARMED too, as an
        SM bringing a port up would leave them); a port that is not ACTIVE
        neither sends nor receives.  A removed port stays DOWN.
        """
        if not isinstance(state, LinkState):
            raise InvalidParameter(f"{state!r} is not a LinkState")
        self._locked(lambda: self._set_state(port, state))

    def set_sm_lid(self, lid: int) -> None:
        """Make ``lid`` the master SM's LID on every port (``SM_CHANGE`` on each)."""
        self._locked(lambda: self.set_sm_lid_locked(lid))

    def client_reregister(self, port: MockPort) -> None:
        """The SM sets ClientReregister on ``port``: its clients re-register."""
        self._locked(lambda: self.port_event(port, AsyncEvent.CLIENT_REREGISTER))

    def set_port_link_locked(self, port: MockPort, up: bool) -> None:
        if port.link is not None:
            self._set_link_state(port.link, up)

    def _set_state(self, port: MockPort, state: LinkState) -> None:
        if port.removed:
            state = LinkState.DOWN
        if port.state is state:
            return
        port.state = state
        self.engine.topology_changed()
        code = AsyncEvent.PORT_ACTIVE if state is LinkState.ACTIVE else AsyncEvent.PORT_DOWN
        self.port_event(port, code)

    def set_pkeys(self, port: MockPort, pkeys: Iterable[int]) -> None:
        """Replace the P_Key table of ``port`` (raises ``PKEY_CHANGE``)."""
        keys = [int(k) & 0xFFFF for k in pkeys]
        if not keys:
            raise InvalidParameter("a P_Key table needs at least one entry")

        def apply() -> None:
            port.pkeys[:] = keys
            self.port_event(port, AsyncEvent.PKEY_CHANGE)

        self._locked(apply)

    def set_lid(self, port: MockPort, lid: int) -> None:
        """Give ``port`` a new unicast LID (raises ``LID_CHANGE``)."""
        self._locked(lambda: self.set_lid_locked(port, lid))

    def set_lid_locked(self, port: MockPort, lid: int) -> None:
        if not 1 <= lid <= MAX_UNICAST_LID:
            raise InvalidParameter(f"0x{lid:x} is not a unicast LID")
        if any(p.lid == lid and p is not port for p in self.ports()) or any(
            s.lid == lid for s in self.switches
        ):
            raise InvalidParameter(f"LID 0x{lid:x} is taken")
        moves_sm = self.sm_lid == port.lid
        port.lid = lid
        self.engine.topology_changed()
        self.port_event(port, AsyncEvent.LID_CHANGE)
        if moves_sm:
            self.set_sm_lid_locked(lid)

    def set_sm_lid_locked(self, lid: int) -> None:
        """Make ``lid`` every port's master SM LID: ``SM_CHANGE`` on each port whose
        SM LID changed (all of them: the mock's SM programs one SM LID everywhere)."""
        if lid == self.sm_lid:
            return
        self.sm_lid = lid
        for p in self.ports():
            if not p.removed:
                self.port_event(p, AsyncEvent.SM_CHANGE)

    # ============================================================== events
    def raise_event(
        self,
        obj: MockQp | MockCq | MockSrq | MockCa | MockPort,
        code: AsyncEvent,
        *,
        vendor_specific: int = 0,
    ) -> None:
        """Raise async event ``code`` for ``obj`` with the context it was created with."""

        def apply() -> None:
            ca: CaState
            context: Any
            target: Any
            port_num: int
            if isinstance(obj, MockQp):
                ca, context, target, port_num = obj.ca, obj.context, obj, obj.port_num
            elif isinstance(obj, MockCq | MockSrq):
                ca, context, target, port_num = obj.ca, obj.context, obj, 0
            else:
                ca = obj if isinstance(obj, MockCa) else obj.ca
                h = ca.opened
                context = None if h is None else h.context
                target = h
                port_num = obj.num if isinstance(obj, MockPort) else 0
            h = ca.opened
            if h is None or target is None:
                raise InvalidParameter(f"{ca.name} is not open: no callback to deliver to")
            self.upcalls.append(
                (target, h.async_event_cb, EventRecord(code, context, vendor_specific, port_num))
            )

        self._locked(apply)

    # ============================================================== lifetime
    def close(self) -> None:
        """Stop the timer thread; the fabric must not be used afterwards."""
        self.engine.close()
        if self._shared_clock is not None:
            self._shared_clock.detach(self)


def _name(end: Endpoint) -> str:
    return end.name
