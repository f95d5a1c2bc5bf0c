"""A MAD-only CA: a libibumad CA with no verbs device (ibsim's ``ibsim0`` under umad2sim).

It has no QP types and no memory: it registers MAD agents
(``Capabilities.mad_agents``) through :class:`~.umad.UmadAgents`, and PDs
(alias QPs hang on a PD; the PD protects nothing here).  Every other verb
raises ``Unsupported`` naming why.

Port attributes: ``umad_get_ca`` at start (sysfs; under umad2sim a snapshot
taken when the process started), then the port's own SMA, asked with a
directed-route SubnGet(PortInfo) and SubnGet(P_KeyTable) at hop count 0 on
``open_ca`` and every ``watch_interval`` seconds from the umad receive thread
(:meth:`UmadAgents.set_tick`: no thread of its own, no busy polling).  A change
raises the async events a verbs device raises (:func:`.portwatch.port_events`),
so the access layer's PnP sees ports go down, come up, or get a new LID or SM.
Where no QP0 agent can be registered (an unprivileged process on a real
kernel), the watch re-reads ``umad_get_ca`` instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ibal.ci.interface import (
    AsyncEventCallback,
    Capabilities,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
    Handle,
    QpCreated,
)
from ibal.providers.rdma_core import portwatch, umad
from ibal.status import (
    IbError,
    InvalidCaHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    DEFAULT_PKEY,
    AccessFlags,
    AsyncEvent,
    AvAttr,
    CaAttr,
    EventRecord,
    Gid,
    LinkLayer,
    LinkState,
    MadAddr,
    MadAgentSpec,
    MadRecv,
    MadSend,
    MadSendDone,
    MrAttr,
    MrKeys,
    NodeType,
    PdType,
    PortAttr,
    QpAttr,
    QpCaps,
    QpMod,
    QpType,
    RecvWr,
    SendWr,
    Wc,
    WcStatus,
)

log = logging.getLogger("ibal.providers.rdma_core")

WATCH_INTERVAL = 1.0
"""Seconds between two looks at a port's PortInfo (the ``watch_interval`` option)."""
OPEN_WAIT = 5.0
"""How long ``open_ca`` waits for the first PortInfo answers."""
SMP_TIMEOUT_MS = 1000

def mad_only_reason(name: str) -> str:
    return (
        f"{name} is a MAD-only CA (a libibumad device with no verbs device, e.g. ibsim "
        "under umad2sim): it sends and receives MADs only"
    )


def mad_only_capabilities(name: str) -> Capabilities:
    """No QP types, no memory, MAD agents."""
    why = mad_only_reason(name)
    off = (
        "qp_types", "special_qps", "atomics", "mw_types", "srq", "resize_cq", "multicast",
        "modify_mr", "port_counters", "modify_ca", "inline_data", "immediate",
        "solicited_events", "sqd", "peek_cq", "rearm_n_cq", "phys_mr", "shared_mr",
        "local_mad", "vendor_call", "violation_counters", "apm", "async_event_injection",
        "resize_qp", "fmr",
    )  # fmt: skip
    return Capabilities(
        qp_types=frozenset(), opcodes={}, special_qps=frozenset(), atomics=False,
        mw_types=frozenset(), srq=False, peek_cq=False, rearm_n_cq=False, resize_cq=False,
        multicast=False, modify_mr=False, local_mad=False, mad_agents=True, modify_ca=False,
        inline_data=False, immediate=False, solicited_events=False, sqd=False,
        reasons=dict.fromkeys(off, why),
    )  # fmt: skip


class _CaHandle:
    __slots__ = ("alive", "ci", "context", "event_cb")

    def __init__(self, ci: UmadCa, event_cb: AsyncEventCallback, context: Any) -> None:
        self.ci, self.event_cb, self.context, self.alive = ci, event_cb, context, True


class _Pd:
    __slots__ = ("alive", "ci", "pd_type")

    def __init__(self, ci: UmadCa, pd_type: PdType) -> None:
        self.ci, self.pd_type, self.alive = ci, pd_type, True


@dataclass
class _Round:
    """One look at a port: the answers still awaited (TID low -> (attribute, block))."""

    awaited: dict[int, tuple[int, int]]
    started: float
    portinfo: bytes | None = None
    blocks: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class _Watch:
    port_num: int
    port_guid: int
    blocks: int
    agent: umad.UmadAgent | None = None
    round: _Round | None = None


def _attr_from_umad(p: umad.UmadPortInfo) -> PortAttr:
    gid = Gid(((p.gid_prefix << 64) | p.port_guid).to_bytes(16, "big"))
    state = LinkState(p.state) if p.state in LinkState._value2member_map_ else LinkState.DOWN
    ll = LinkLayer.ETHERNET if p.link_layer.lower() == "ethernet" else LinkLayer.INFINIBAND
    return PortAttr(
        port_num=p.port_num, port_guid=p.port_guid, lid=p.lid, lmc=p.lmc, sm_lid=p.sm_lid,
        sm_sl=p.sm_sl, link_state=state, pkeys=p.pkeys or (DEFAULT_PKEY,), gids=(gid,),
        link_layer=ll,
    )  # fmt: skip


class UmadCa(umad.AgentVerbs, ChannelInterface):
    """One libibumad CA without a verbs device; see the module docstring."""

    provider_name = "rdma_core"

    def __init__(self, info: umad.UmadCaInfo, *, watch_interval: float = WATCH_INTERVAL) -> None:
        self.name = info.name
        self.guid = info.node_guid
        self.info = info
        self.watch_interval = watch_interval
        self._stale_after = max(3 * watch_interval, 4 * SMP_TIMEOUT_MS / 1000)
        self._caps = mad_only_capabilities(info.name)
        self._lock = threading.Lock()
        self._ports: dict[int, PortAttr] = {p.port_num: _attr_from_umad(p) for p in info.ports}
        self._open: _CaHandle | None = None
        self._agents: umad.UmadAgents | None = None
        self._watches: dict[int, _Watch] = {}
        self._tid = 0
        self._first = threading.Condition(self._lock)
        self._pds = 0
        self.notes: list[str] = []

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def _unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"{what}: {mad_only_reason(self.name)}")

    # ------------------------------------------------------------ CA access
    def open_ca(
        self, completion_cb: CompletionCallback, async_event_cb: AsyncEventCallback, ca_context: Any
    ) -> Handle:
        """Open the umad ports' agents and learn the ports from their SMA (blocks up to
        :data:`OPEN_WAIT` seconds for the first answers)."""
        if not callable(completion_cb) or not callable(async_event_cb):
            raise InvalidParameter("open_ca needs a completion and an async event callback")
        with self._lock:
            if self._open is not None:
                raise ResourceBusy(f"{self.name} is already open")
            h = _CaHandle(self, async_event_cb, ca_context)
            self._open = h
        try:
            agents = umad.agents_for(self.name)
        except BaseException:
            with self._lock:
                self._open = None
            raise
        self._agents = agents
        try:
            watches = self._start_watch(agents)
        except BaseException:
            self.close_ca(h)
            raise
        if watches:
            with self._lock:
                self._first.wait_for(
                    lambda: all(w.round is None for w in self._watches.values()), OPEN_WAIT
                )
        agents.set_tick(self.watch_interval, self._tick)
        return h

    def _start_watch(self, agents: umad.UmadAgents) -> int:
        """A QP0 agent per port for the look at its SMA, and the first look; how many."""
        started = 0
        for num, attr in sorted(self._ports.items()):
            blocks = max(1, -(-len(attr.pkeys) // portwatch.PKEYS_PER_BLOCK))
            w = _Watch(num, attr.port_guid, blocks)
            try:
                w.agent = agents.register(
                    MadAgentSpec(num, 0, 0x81, 1, self._on_smp, self._on_smp_done)
                )
            except IbError as exc:
                self.notes.append(f"port {num}: watched through umad_get_ca ({exc})")
            with self._lock:
                self._watches[num] = w
            if w.agent is not None:
                self._look(w)
                started += 1
        return started

    def query_ca(self, h_ca: Handle) -> CaAttr:
        self._ca(h_ca)
        return self.ca_attr()

    def ca_attr(self) -> CaAttr:
        """The CA's attributes (also before open, e.g. for ``ibal info``)."""
        with self._lock:
            ports = tuple(self._ports[n] for n in sorted(self._ports))
        return CaAttr(
            ca_guid=self.guid, fw_version=self.info.fw_ver,
            system_image_guid=self.info.system_guid,
            node_type=NodeType(self.info.node_type) if self.info.node_type in (1, 2, 3)
            else NodeType.CA,
            ports=ports,
        )  # fmt: skip

    def close_ca(self, h_ca: Handle) -> None:
        h = self._ca(h_ca)
        with self._lock:
            if self._pds:
                raise ResourceBusy(f"{self._pds} PDs still allocated on {self.name}")
            h.alive = False
            self._open = None
            agents, self._agents = self._agents, None
            watches, self._watches = list(self._watches.values()), {}
        if agents is not None:
            for w in watches:
                if w.agent is not None and w.agent.alive:
                    agents.unregister(w.agent)
            agents.close()

    def _ca(self, h_ca: Handle) -> _CaHandle:
        if type(h_ca) is not _CaHandle or h_ca.ci is not self or not h_ca.alive:
            raise InvalidCaHandle(f"not an open handle of {self.name}")
        return h_ca

    # ------------------------------------------------------------ port watch
    def _next_tid(self) -> int:
        self._tid = (self._tid + 1) & 0xFFFFFFFF or 1
        return self._tid

    def _look(self, w: _Watch) -> None:
        """Ask the port's SMA for PortInfo and the P_Key table (one round at a time)."""
        agents = self._agents
        if agents is None or w.agent is None:
            return
        stale: list[int] = []
        with self._lock:  # never held while calling into the agents (their lock comes first)
            old = w.round
            if old is not None:
                if time.monotonic() - old.started < self._stale_after:
                    return  # the last look is still waiting for its answers
                # Unanswered (under umad2sim nothing times a request out): start again.
                stale = list(old.awaited)
            wanted = [(portwatch.ATTR_PORT_INFO, 0)]
            wanted += [(portwatch.ATTR_PKEY_TABLE, b) for b in range(w.blocks)]
            sends = [(self._next_tid(), attr, block) for attr, block in wanted]
            w.round = _Round({tid: (attr, block) for tid, attr, block in sends},
                             time.monotonic())  # fmt: skip
        for tid in stale:
            agents.abandon(w.agent, tid)
        here = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)
        for tid, attr, block in sends:
            mad = portwatch.local_smp(tid, attr, block)
            try:
                agents.send(w.agent, MadSend(mad, here, SMP_TIMEOUT_MS, 1, context=w.port_num))
            except IbError as exc:
                log.debug("umad %s port %d: look failed: %s", self.name, w.port_num, exc)
                with self._lock:
                    w.round = None
                    self._first.notify_all()
                return

    def _on_smp_done(self, done: MadSendDone) -> None:
        """A look was not answered: give the round up (the next tick tries again)."""
        if done.status is WcStatus.SUCCESS:
            return
        with self._lock:
            w = self._watches.get(done.context) if isinstance(done.context, int) else None
            if w is not None:
                w.round = None
                self._first.notify_all()

    def _on_smp(self, recv: MadRecv) -> None:
        """An answer of the port's SMA (umad receive thread, agents' lock held)."""
        mad = recv.mad
        tid = int.from_bytes(mad[12:16], "big")
        events: list[AsyncEvent] = []
        with self._lock:
            w = self._watches.get(recv.port_num)
            r = w.round if w is not None else None
            if w is None or r is None or tid not in r.awaited:
                return
            attr, block = r.awaited.pop(tid)
            if portwatch.smp_status(mad):
                w.round = None  # the SMA refused: keep what we have
                self._first.notify_all()
                return
            data = mad[portwatch.SMP_DATA:]
            if attr == portwatch.ATTR_PORT_INFO:
                r.portinfo = data[: portwatch.PORT_INFO.size]
            else:
                r.blocks[block] = portwatch.pkey_block(mad)
            if r.awaited or r.portinfo is None:
                return
            pkeys = tuple(k for b in sorted(r.blocks) for k in r.blocks[b])
            new = portwatch.port_attr(w.port_num, w.port_guid, r.portinfo, pkeys)
            old = self._ports.get(w.port_num)
            self._ports[w.port_num] = new
            w.round = None
            self._first.notify_all()
            if old is not None:
                events = portwatch.port_events(old, new)
            if portwatch.client_reregister(r.portinfo):
                events.append(AsyncEvent.CLIENT_REREGISTER)
            h = self._open
        if h is not None and h.alive:
            for code in events:
                h.event_cb(EventRecord(code=code, context=h.context, port_num=w.port_num))

    def _tick(self) -> None:
        """Receive thread, every ``watch_interval``: look at every port again."""
        with self._lock:
            watches = list(self._watches.values())
        unwatched = [w for w in watches if w.agent is None]
        for w in watches:
            if w.agent is not None:
                self._look(w)
        if unwatched:
            self._reread_umad(unwatched)

    def _reread_umad(self, watches: Sequence[_Watch]) -> None:
        try:
            info = umad.ca_info(self.name)
        except (IbError, umad.UmadUnavailable) as exc:
            log.debug("umad %s: umad_get_ca failed: %s", self.name, exc)
            return
        fresh = {p.port_num: _attr_from_umad(p) for p in info.ports}
        changes: list[tuple[int, AsyncEvent]] = []
        with self._lock:
            for w in watches:
                new = fresh.get(w.port_num)
                old = self._ports.get(w.port_num)
                if new is None or old is None:
                    continue
                self._ports[w.port_num] = new
                changes += [(w.port_num, e) for e in portwatch.port_events(old, new)]
            h = self._open
        if h is not None and h.alive:
            for num, code in changes:
                h.event_cb(EventRecord(code=code, context=h.context, port_num=num))

    # ------------------------------------------------------------ MAD agents
    def _port_num(self, port_num: int) -> None:
        if not isinstance(port_num, int) or port_num not in self._ports:
            raise InvalidPort(f"{self.name} has no port {port_num!r}")

    def register_mad_agent(self, h_ca: Handle, spec: MadAgentSpec) -> Handle:
        """Over libibumad (see :class:`~.umad.UmadAgents`); any thread, may block briefly."""
        self._ca(h_ca)
        if not isinstance(spec, MadAgentSpec):
            raise InvalidParameter("a MadAgentSpec is required")
        self._port_num(spec.port_num)
        agents = self._agents
        if agents is None:
            raise InvalidCaHandle(f"{self.name} is closed")
        return agents.register(spec)

    def _agent_table(self) -> umad.UmadAgents | None:
        return self._agents

    # ------------------------------------------------------------ PDs
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        """A PD for alias QPs; it guards no memory (this CA registers none)."""
        self._ca(h_ca)
        with self._lock:
            self._pds += 1
        return _Pd(self, pd_type)

    def deallocate_pd(self, h_pd: Handle) -> None:
        if type(h_pd) is not _Pd or h_pd.ci is not self or not h_pd.alive:
            raise InvalidPdHandle("not a live PD of this CA")
        with self._lock:
            h_pd.alive = False
            self._pds -= 1

    # ------------------------------------------------------------ what needs verbs
    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        raise self._unsupported("address vectors")

    def query_av(self, h_av: Handle) -> AvAttr:
        raise self._unsupported("address vectors")

    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        raise self._unsupported("address vectors")

    def destroy_av(self, h_av: Handle) -> None:
        raise self._unsupported("address vectors")

    def create_qp(
        self, h_pd: Handle, qp_type: QpType, caps: QpCaps, send_cq: Handle, recv_cq: Handle,
        srq: Handle | None, sq_signaled: bool, qp_context: Any,
    ) -> QpCreated:  # fmt: skip
        raise self._unsupported("QPs")

    def create_spl_qp(
        self, h_pd: Handle, port_num: int, qp_type: QpType, caps: QpCaps, send_cq: Handle,
        recv_cq: Handle, qp_context: Any,
    ) -> QpCreated:  # fmt: skip
        raise self._unsupported("special QPs (MADs go through the MAD-agent verbs)")

    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        raise self._unsupported("QPs")

    def query_qp(self, h_qp: Handle) -> QpAttr:
        raise self._unsupported("QPs")

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        raise self._unsupported("QPs")

    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        raise self._unsupported("CQs")

    def query_cq(self, h_cq: Handle) -> int:
        raise self._unsupported("CQs")

    def destroy_cq(self, h_cq: Handle) -> None:
        raise self._unsupported("CQs")

    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        raise self._unsupported("memory registration")

    def query_mr(self, h_mr: Handle) -> MrAttr:
        raise self._unsupported("memory registration")

    def deregister_mr(self, h_mr: Handle) -> None:
        raise self._unsupported("memory registration")

    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        raise self._unsupported("QPs")

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        raise self._unsupported("QPs")

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        raise self._unsupported("CQs")

    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        raise self._unsupported("CQs")

    # ------------------------------------------------------------ details
    def describe(self) -> dict[str, Any]:
        """Facts for ``ibal info`` and the docs."""
        return {
            "name": self.name,
            "guid": f"{self.guid:016x}",
            "kind": "mad-only",
            "ca_type": self.info.ca_type,
            "notes": list(self.notes),
        }


__all__ = ["UmadCa", "mad_only_capabilities"]
