"""The process-wide CM agent: one per :class:`~ibal.al.AlManager`, the I/O layer of ``ibal.cm``.

Every AL instance of a manager listens and connects through the same
:class:`CmAgent`: the CM class of a port has one receiver, and a REQ must
reach whichever AL listens for its service ID.  The agent opens its own
internal AL (``mgr.open_al()``), follows PnP for ports (a :class:`CmPort`
per active port: the MAD service of class 0x07 version 2 and one timer),
and hands each received CM MAD to its :class:`~ibal.cm.router.CmRouter`
(REQs to listens, the rest to endpoints).  The agent owns the ports, the
endpoints and their tables, and the listen table.

Each endpoint (:class:`CepIo`) runs the sans-IO machine of
``ibal.cm.fsm`` (or ``ibal.cm.sidr_fsm``); the agent carries out its
actions: transmit (TIDs as Linux forms them: ``dispatch.form_tid``), the
endpoint's one timer on its port, releases; QP changes and user callbacks
go to the endpoint's user object (the connection handle in the user's AL,
``ibal.cm.conn``), which posts the callbacks to the AL's misc queue.

Threads: received MADs and timers are handled on the misc queue; API calls
on the caller's thread.  One lock serialises the machines and the tables.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from ibal import osrandom
from ibal.al import AccessLayer, AlManager, Dependent, PnpClass, PnpEvent, PnpOrder, StashKey
from ibal.cm import fsm
from ibal.cm.dispatch import ListenLike, ListenTable, as_int, form_tid, same_sender
from ibal.cm.port import CmPort
from ibal.cm.router import OPENERS, CmRouter
from ibal.status import IbError, InvalidParameter, InvalidState, NotFound, Status
from ibal.types import DEFAULT_PKEY, Gid, Grh, LinkLayer, LinkState, MadAddr, PortAttr
from ibal.wire.fields import Value
from ibal.wire.mad.cm import CmAttr

if TYPE_CHECKING:
    from ibal.al import PnpRec, PnpRegistration

__all__ = ["CepIo", "CepUser", "CmAgent", "ListenUser", "agent_of"]

log = logging.getLogger("ibal.cm")

_AGENTS: StashKey[CmAgent] = StashKey()  # in each manager's stash
_AGENTS_LOCK = threading.Lock()
_LATE_EVENTS: Final = (fsm.TimerFired, fsm.RecvMsg, fsm.Destroy)  # dropped once released

_LISTEN_EVENTS = frozenset({PnpEvent.PORT_REMOVE, PnpEvent.PORT_DOWN, PnpEvent.LID_CHANGE,
                            PnpEvent.PKEY_CHANGE})  # fmt: skip


class CepUser(Protocol):
    """The user-side object of an endpoint (a connection handle): QP changes, callbacks."""

    def cm_modify(self, cep: CepIo, target: Any) -> None: ...

    def cm_upcall(self, cep: CepIo, upcall: fsm.Deliver) -> None: ...


class ListenUser(ListenLike, Protocol):
    """A listen as the agent sees it: it makes the user object of a new passive endpoint."""

    def cm_incoming(self, cep: CepIo, fields: dict[str, Value]) -> CepUser | None: ...

    def cm_error(self, reason: Status) -> None: ...

    def admits(self) -> bool: ...

    def track(self, cep: CepIo, conn: Any, fields: dict[str, Value]) -> None: ...


class CepIo:
    """One endpoint as the agent drives it: the machine, its port, peer address and TID."""

    __slots__ = (
        "__weakref__",
        "addr",
        "agent",
        "due",
        "fields",
        "generation",
        "local_comm_id",
        "machine",
        "port",
        "remote_ca_guid",
        "remote_comm_id",
        "remote_key",
        "sidr",
        "tid",
        "user",
    )  # fmt: skip

    def __init__(self, agent: CmAgent, port: CmPort, local_comm_id: int, machine: Any,
                 addr: MadAddr, *, sidr: bool = False) -> None:  # fmt: skip
        self.agent = agent
        self.port = port
        self.local_comm_id = local_comm_id
        self.machine = machine
        self.addr = addr
        self.sidr = sidr
        self.tid = 0
        self.due: float | None = None
        self.generation = 0
        self.remote_comm_id: int | None = None
        self.remote_ca_guid: int | None = None
        self.remote_key: tuple[Any, ...] | None = None
        self.user: CepUser | None = None
        self.fields: dict[CmAttr, dict[str, Value]] = {}
        """The last message of each kind received (REQ, REP...): what records are built from."""

    def __repr__(self) -> str:
        state = getattr(self.machine, "state", None)
        return f"<CepIo 0x{self.local_comm_id:08x} {getattr(state, 'name', state)}>"

    @property
    def state(self) -> Any:
        return self.machine.state

    def fire(self, now: float) -> None:
        """The port's timer came for this endpoint (misc queue)."""
        self.agent.run(self, fsm.TimerFired(self.generation))

    def handle(self, event: Any) -> None:
        """Feed an API event (``InvalidState`` when the machine refuses it)."""
        self.agent.run(self, event)


class _AgentLife(Dependent):
    """Hangs on the agent's AL: when the manager closes it, the agent leaves the registry
    (the agent's AL refers to the manager, so the weak registry alone would keep both)."""

    _kind = "CM agent"

    def __init__(self, al: AccessLayer, mgr: AlManager) -> None:
        self._mgr_ref = weakref.ref(mgr)
        super().__init__(al)

    def on_destroying(self) -> None:
        mgr = self._mgr_ref()
        if mgr is not None:
            with _AGENTS_LOCK:
                agent = mgr.stash.get(_AGENTS, None)
                if agent is not None and agent.al is self.al:
                    del mgr.stash[_AGENTS]


def agent_of(mgr: AlManager) -> CmAgent:
    """The manager's CM agent, started on first use (``InvalidState`` once it is closed)."""
    with _AGENTS_LOCK:
        agent = mgr.stash.get(_AGENTS, None)
        if agent is None or agent.closed:
            if mgr.closed:
                raise InvalidState("the AL manager is closed")
            agent = CmAgent(mgr)
            mgr.stash[_AGENTS] = agent
        return agent


class CmAgent:
    """The CM of one manager (see the module docstring)."""

    def __init__(self, mgr: AlManager) -> None:
        self.al: AccessLayer = mgr.open_al()
        self.stats: Counter[str] = Counter()
        """Dropped MADs by reason, REJs and SIDR_REPs sent for nobody listening."""
        self._lock = threading.RLock()
        self._ports: dict[int, CmPort] = {}  # port GUID -> port
        self._by_num: dict[tuple[int, int], CmPort] = {}  # (CA GUID, port number) -> port
        self._ceps: dict[int, CepIo] = {}  # local comm ID -> endpoint (see new_cep)
        self._remote: dict[tuple[Any, ...], CepIo] = {}  # (kind, remote id, sender) -> endpoint
        self._peers: dict[int, list[CepIo]] = {}  # service ID -> peer-to-peer REQs out
        self.listens = ListenTable()
        self.router = CmRouter(self)
        """Where received CM MADs go (REQs to listens, the rest to endpoints)."""
        self._running = 0  # machines being run by the lock's holder (nested runs count)
        self._after: list[Callable[[], object]] = []  # what waits for the outermost run
        self._pnp: PnpRegistration | None = None
        # PnpOrder.CM: ports come to the CM before user clients, and leave it after them.
        self._pnp = self.al.reg_pnp(PnpClass.PORT, self._on_pnp, order=PnpOrder.CM)
        _AgentLife(self.al, mgr)
        self._scan()

    def _scan(self) -> None:
        """Serve every active port now (PnP's replay comes later, on its queue): a listen
        hears REQs as soon as it returns."""
        for ca_guid in self.al.get_ca_guids():
            with contextlib.suppress(IbError):
                for pa in self.al.query_ca_by_guid(ca_guid).ports:
                    if pa.link_state is LinkState.ACTIVE:
                        with contextlib.suppress(IbError):
                            self.port(ca_guid, pa.port_num)

    def __repr__(self) -> str:
        return f"<CmAgent {len(self._ports)} ports, {len(self._ceps)} endpoints>"

    @property
    def closed(self) -> bool:
        return self.al.closed

    @property
    def lock(self) -> threading.RLock:
        """The lock of the machines and tables (held while the agent calls a user object)."""
        return self._lock

    @property
    def endpoints(self) -> int:
        """Endpoints alive (timewait included): 0 once everything was released."""
        return len(self._ceps)

    def armed_timers(self) -> int:
        """Deadlines armed on the agent's ports."""
        with self._lock:
            ports = list(self._ports.values())
        return sum(p.armed for p in ports if p.alive)

    # ------------------------------------------------------------------ ports
    def _on_pnp(self, rec: PnpRec) -> None:
        """PnP queue: a port that becomes active gets its CM service; one removed loses it
        (by the cascade: a :class:`CmPort` hangs on the port)."""
        attr = rec.port_attr
        if attr is None:
            return
        if rec.event in (PnpEvent.PORT_ADD, PnpEvent.PORT_ACTIVE) and \
                attr.link_state is LinkState.ACTIVE:  # fmt: skip
            with contextlib.suppress(IbError):
                self.port(rec.ca_guid, attr.port_num)
        elif rec.event is PnpEvent.PORT_REMOVE:
            with self._lock:
                gone = self._ports.pop(attr.port_guid, None)
                if gone is not None and self._by_num.get((rec.ca_guid, attr.port_num)) is gone:
                    del self._by_num[(rec.ca_guid, attr.port_num)]
        self._check_listens(rec)

    def _check_listens(self, rec: PnpRec) -> None:
        """A local change that invalidates a directed listen (its port gone or down, its
        LID or P_Key no longer the port's) calls its error callback; it stays listed."""
        attr = rec.port_attr
        if attr is None or rec.event not in _LISTEN_EVENTS:
            return
        with self._lock:
            listens = [x for x in self.listens if x.port_guid == attr.port_guid]
        for listen in listens:
            reason: Status | None = None
            if rec.event in (PnpEvent.PORT_REMOVE, PnpEvent.PORT_DOWN):
                reason = Status.INVALID_PORT_STATE
            elif listen.lid and not attr.lid <= listen.lid < attr.lid + (1 << attr.lmc):
                reason = Status.INVALID_LID
            elif listen.pkey and all(k & 0x7FFF != listen.pkey & 0x7FFF for k in attr.pkeys):
                reason = Status.INVALID_PKEY
            if reason is not None:
                cast_listen(listen).cm_error(reason)

    def port(self, ca_guid: int, port_num: int) -> CmPort:
        """The agent's port, registered now if PnP has not done it yet."""
        # Read without the lock (one dict lookup is atomic): every connect asks, and the
        # misc queue holds the lock while it answers REPs.
        p = self._by_num.get((ca_guid, port_num))
        if p is not None and p.alive:
            return p
        with self._lock:
            p = self._by_num.get((ca_guid, port_num))
            if p is not None and p.alive:
                return p
            ca = self.al.open_ca(ca_guid)
            p = CmPort(ca, port_num, self.router.on_mad, self._port_gone)
            self._ports[p.port_guid] = p
            self._by_num[(ca_guid, port_num)] = p
            return p

    def _port_gone(self, port: CmPort) -> None:
        """A port went (its CA withdrawn, the port removed, the agent closing): its endpoints
        can neither send nor time anything, nor hear their peers: released, no upcall (their
        users hang on QPs of that CA, or learn it from their QP)."""
        with self._lock:
            if self._ports.get(port.port_guid) is port:
                del self._ports[port.port_guid]
            # list() copies in one step under the GIL: new_cep inserts without the lock
            for cep in [c for c in list(self._ceps.values()) if c.port is port]:
                self._release(cep)

    def port_by_guid(self, port_guid: int) -> CmPort:
        with self._lock:
            p = self._ports.get(port_guid)
            if p is not None and p.alive:
                return p
        for ca_guid in self.al.get_ca_guids():
            for pa in self.al.query_ca_by_guid(ca_guid).ports:
                if pa.port_guid == port_guid:
                    return self.port(ca_guid, pa.port_num)
        raise NotFound(f"no local port has GUID 0x{port_guid:016x}")

    # ------------------------------------------------------------------ endpoints
    def new_cep(self, port: CmPort, machine_factory: Callable[[int, float], Any], addr: MadAddr,
                *, sidr: bool = False) -> CepIo:  # fmt: skip
        """A new endpoint with a fresh random comm ID (unique among the living and timewait).

        Without the agent's lock: the endpoint is nobody's until it is in the table, and
        ``setdefault`` claims its comm ID atomically (``_ceps`` is only iterated through a
        ``list()`` copy).  An endpoint made on a port going meanwhile is released by
        :meth:`run` when it is first used."""
        now = port.now()
        while True:
            # from the OS (buffered: a getrandom() call per ID gave up the GIL, ~1 ms per
            # connect on a busy misc queue); a seeded Twister was predictable after 624 IDs
            comm_id = osrandom.randbits(32)
            if not comm_id or comm_id in self._ceps:
                continue
            cep = CepIo(self, port, comm_id, machine_factory(comm_id, now), addr, sidr=sidr)
            if self._ceps.setdefault(comm_id, cep) is cep:
                return cep

    def bind_remote(self, cep: CepIo, key: tuple[Any, ...]) -> None:
        with self._lock:
            cep.remote_key = key
            self._remote[key] = cep

    def add_peer(self, cep: CepIo, svc_id: int) -> None:
        """A peer-to-peer REQ: a REQ to ``svc_id`` arriving while it waits meets it."""
        with self._lock:
            self._peers.setdefault(svc_id, []).append(cep)

    def peer_for(self, svc_id: int, port: CmPort, sender: MadAddr) -> CepIo | None:
        """The peer-to-peer REQ of ours a REQ from ``sender`` on ``port`` meets (under
        the lock)."""
        live = [c for c in self._peers.get(svc_id, ())
                if self._ceps.get(c.local_comm_id) is c
                and c.state in (fsm.CmState.REQ_SENT, fsm.CmState.MRA_REQ_RCVD)]  # fmt: skip
        match = next((c for c in live if c.port is port and same_sender(c.addr, sender)), None)
        rest = [c for c in live if c is not match]
        if rest:
            self._peers[svc_id] = rest
        else:
            self._peers.pop(svc_id, None)
        return match

    def find(self, local_comm_id: int) -> CepIo | None:
        """The live endpoint (timewait included) of a local comm ID."""
        return self._ceps.get(local_comm_id)

    def remote(self, key: tuple[Any, ...]) -> CepIo | None:
        """The endpoint bound to a peer's key (``bind_remote``)."""
        return self._remote.get(key)

    def run(self, cep: CepIo, event: Any) -> None:
        """Feed one event to ``cep``'s machine and carry out its actions, in order."""
        with self._lock:
            if self._ceps.get(cep.local_comm_id) is not cep:
                if isinstance(event, _LATE_EVENTS):
                    return  # released meanwhile
                raise InvalidState("the connection is closed")
            if isinstance(event, fsm.RecvMsg):
                cep.fields[event.attr] = dict(event.fields)
            self._running += 1
            try:
                actions = cep.machine.handle(event, cep.port.now())
                for a in actions:
                    self._act(cep, a)
                if not cep.port.alive and self._ceps.get(cep.local_comm_id) is cep:
                    self._release(cep)  # its port went meanwhile (see _port_gone)
            finally:
                self._running -= 1
            if not self._running:
                self._run_after()

    def after_run(self, fn: Callable[[], object]) -> None:
        """Under the lock, from an action: ``fn()`` once the machine's actions are all
        carried out (still under the lock, on this thread), so it may feed the machine
        again: an answer the API layer gives by itself (an RTU, a DREP)."""
        if self._running:
            self._after.append(fn)
        else:
            fn()

    def _run_after(self) -> None:
        while self._after:
            fn = self._after.pop(0)
            try:
                fn()
            except Exception:  # an answer's failure must not lose the ones after it
                log.exception("CM agent: an answer after a machine's run failed")

    def _act(self, cep: CepIo, a: Any) -> None:
        kind = type(a)
        if kind is fsm.Transmit:
            if a.attr in OPENERS:
                cep.tid = form_tid(cep.port.hi_tid, cep.local_comm_id)
            if not cep.port.alive or not cep.port.send(a.attr, cep.tid, a.msg, cep.addr):
                self.stats["send_failed"] += 1  # the retry timer (if any) tries again
        elif kind is fsm.ArmTimer:
            cep.generation = a.generation
            cep.port.arm(cep, a.at)
        elif kind is fsm.CancelTimer:
            cep.port.arm(cep, None)
        elif kind is fsm.Deliver:
            user = cep.user
            if user is not None:
                user.cm_upcall(cep, a)
        elif kind is fsm.ModifyQp:
            user = cep.user
            if user is not None:
                user.cm_modify(cep, a.target)
        elif kind is fsm.EnterTimewait:
            pass  # the machine armed its timer for the end of it; the comm ID stays taken
        elif kind is fsm.Release:
            self._release(cep)
        elif kind is fsm.Drop:
            self.stats[f"dropped: {a.reason}"] += 1
        else:
            log.warning("CM agent: unknown action %r", a)

    def _release(self, cep: CepIo) -> None:
        cep.port.arm(cep, None)
        cep.user = None
        if self._ceps.get(cep.local_comm_id) is cep:
            del self._ceps[cep.local_comm_id]
        if cep.remote_key is not None and self._remote.get(cep.remote_key) is cep:
            del self._remote[cep.remote_key]
        self.router.forget(cep)

    def release(self, cep: CepIo) -> None:
        """Free ``cep`` now, without a word to its peer (a REQ its listen did not take)."""
        with self._lock:
            self._release(cep)

    def forget_user(self, cep: CepIo) -> None:
        """The user's object is gone: the machine leaves politely with no more upcalls."""
        with self._lock:
            cep.user = None
            if self._ceps.get(cep.local_comm_id) is cep:
                self.run(cep, fsm.Destroy())

    # ------------------------------------------------------------------ listens
    def add_listen(self, listen: ListenUser) -> None:
        with self._lock:
            self.listens.add(listen)

    def remove_listen(self, listen: ListenUser) -> None:
        with self._lock:
            self.listens.remove(listen)

    def find_listen(self, svc_id: int, *, ud: bool = False) -> ListenUser | None:
        """A listen on ``svc_id`` (any compare data, any port): the target of a handoff."""
        with self._lock:
            for listen in self.listens:
                if listen.svc_id == svc_id and listen.ud == ud:
                    return listen  # type: ignore[return-value]
        return None

    # ------------------------------------------------------------------ addresses
    def path_addr(self, port: CmPort, path: dict[str, Value],
                  pa: PortAttr | None = None) -> MadAddr:  # fmt: skip
        """Where the CM of a path's destination is: its QP1, over the path (GRH on RoCE and
        off-subnet; P_Key index of the path's P_Key).  ``pa``: the port's attributes if the
        caller has them fresh."""
        if pa is None:
            pa = port.ca.query_port(port.port_num)
        hop = as_int(path.get("hop_limit", 0))
        roce = port.link_layer is not LinkLayer.INFINIBAND
        grh = None
        if roce or hop > 1:
            sgid_index = pa.gid_index(_gid(path["sgid"]).packed) or 0
            grh = Grh(dgid=_gid(path["dgid"]), sgid_index=sgid_index, hop_limit=hop or 64,
                      traffic_class=as_int(path.get("tclass", 0)),
                      flow_label=as_int(path.get("flow_label", 0)))  # fmt: skip
        pkey = as_int(path.get("p_key", DEFAULT_PKEY)) or DEFAULT_PKEY
        pkey_index = pa.pkey_index(pkey) or 0
        return MadAddr(remote_qp=1, dlid=0 if roce else as_int(path["dlid"]),
                       sl=as_int(path.get("sl", 0)), pkey_index=pkey_index, grh=grh)  # fmt: skip



def cast_listen(listen: ListenLike) -> ListenUser:
    return listen  # type: ignore[return-value]


def _gid(v: object) -> Gid:
    if isinstance(v, Gid):
        return v
    if isinstance(v, (bytes, bytearray)) and len(v) == 16:
        return Gid(bytes(v))
    raise InvalidParameter(f"expected a GID, got {v!r}")
