"""The process-wide CM agent: one per :class:`~ibal.al.AlManager`, the I/O layer of ``ibal.cm``.

Every AL instance of a manager listens and connects through the same
:class:`CmAgent`: the CM class of a port has one receiver, and a REQ must
reach whichever AL listens for its service ID.  The agent opens its own
internal AL (``mgr.open_al()``), follows PnP for ports (a :class:`CmPort`
per active port: the MAD service of class 0x07 version 2 and one timer),
and routes each received CM MAD:

* REQ / SIDR_REQ: a retransmission of a known one (by the sender's comm ID
  and CA GUID, or request ID and sender) goes to its endpoint; a new one to
  the listen of its service ID (compare data, directed listens:
  ``ibal.cm.dispatch``), or is rejected (REJ "invalid service ID", SIDR_REP
  "unsupported") when nobody listens;
* every other message: to the endpoint whose local comm ID it names, when it
  comes from that endpoint's peer (its comm ID, its address); else dropped.

Malformed and forged MADs are dropped and counted in :attr:`CmAgent.stats`,
never raise.  Each endpoint (:class:`CepIo`) runs the sans-IO machine of
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
import random
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ibal.al import AccessLayer, AlManager, Dependent, PnpClass, PnpEvent, PnpOrder
from ibal.cm import fsm, wire
from ibal.cm.dispatch import Arrival, ListenLike, ListenTable, form_tid
from ibal.cm.port import CmPort
from ibal.mad import cm as cmw
from ibal.mad.cm import CmAttr, MessageMraed, RejReason
from ibal.mad.consts import Method
from ibal.status import IbError, InvalidParameter, InvalidState, NotFound, Status
from ibal.types import DEFAULT_PKEY, Gid, Grh, LinkLayer, LinkState, MadAddr
from ibal.wire.fields import FieldError, Value

if TYPE_CHECKING:
    from ibal.al import PnpRec, PnpRegistration

__all__ = ["CepIo", "CepUser", "CmAgent", "ListenUser", "agent_of"]

log = logging.getLogger("ibal.cm")

_AGENTS: weakref.WeakKeyDictionary[AlManager, CmAgent] = weakref.WeakKeyDictionary()
_AGENTS_LOCK = threading.Lock()

# Messages that open an exchange get a TID of their own; the answers echo it.
_LISTEN_EVENTS = frozenset({PnpEvent.PORT_REMOVE, PnpEvent.PORT_DOWN, PnpEvent.LID_CHANGE,
                            PnpEvent.PKEY_CHANGE})  # fmt: skip
_OPENERS = frozenset({CmAttr.REQ, CmAttr.DREQ, CmAttr.LAP, CmAttr.SIDR_REQ})
# Messages whose sender's comm ID we may not know yet (the first answer to our REQ).
_FIRST_ANSWERS = frozenset({CmAttr.REP, CmAttr.REJ, CmAttr.MRA})


class CepUser(Protocol):
    """The user-side object of an endpoint (a connection handle): QP changes, callbacks."""

    def cm_modify(self, cep: CepIo, target: Any) -> None: ...

    def cm_upcall(self, cep: CepIo, upcall: fsm.Upcall) -> None: ...


class ListenUser(ListenLike, Protocol):
    """A listen as the agent sees it: it makes the user object of a new passive endpoint."""

    def cm_incoming(self, cep: CepIo, fields: dict[str, Value]) -> CepUser | None: ...

    def cm_error(self, reason: Status) -> None: ...


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
                agent = _AGENTS.get(mgr)
                if agent is not None and agent.al is self.al:
                    del _AGENTS[mgr]


def agent_of(mgr: AlManager) -> CmAgent:
    """The manager's CM agent, started on first use (``InvalidState`` once it is closed)."""
    with _AGENTS_LOCK:
        agent = _AGENTS.get(mgr)
        if agent is None or agent.closed:
            if mgr.closed:
                raise InvalidState("the AL manager is closed")
            agent = CmAgent(mgr)
            _AGENTS[mgr] = agent
        return agent


class CmAgent:
    """The CM of one manager (see the module docstring)."""

    def __init__(self, mgr: AlManager) -> None:
        self.al: AccessLayer = mgr.open_al()
        self.stats: Counter[str] = Counter()
        """Dropped MADs by reason, REJs and SIDR_REPs sent for nobody listening."""
        self._lock = threading.RLock()
        self._ports: dict[int, CmPort] = {}  # port GUID -> port
        self._ceps: dict[int, CepIo] = {}  # local comm ID -> endpoint
        self._remote: dict[tuple[Any, ...], CepIo] = {}  # (kind, remote id, sender) -> endpoint
        self._peers: dict[int, list[CepIo]] = {}  # service ID -> peer-to-peer REQs out
        self._by_qp: dict[tuple[int, int], CepIo] = {}  # (remote CA GUID, QPN) -> endpoint
        self.listens = ListenTable()
        self._rng = random.SystemRandom()
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
                self._ports.pop(attr.port_guid, None)
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
        with self._lock:
            for p in self._ports.values():
                if p.ca_guid == ca_guid and p.port_num == port_num and p.alive:
                    return p
            ca = self.al.open_ca(ca_guid)
            p = CmPort(ca, port_num, self._on_mad)
            self._ports[p.port_guid] = p
            return p

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
        """A new endpoint with a fresh random comm ID (unique among the living and timewait)."""
        with self._lock:
            while True:
                comm_id = self._rng.getrandbits(32)
                if comm_id and comm_id not in self._ceps:
                    break
            cep = CepIo(self, port, comm_id, machine_factory(comm_id, port.now()), addr,
                        sidr=sidr)  # fmt: skip
            self._ceps[comm_id] = cep
            return cep

    def bind_remote(self, cep: CepIo, key: tuple[Any, ...]) -> None:
        with self._lock:
            cep.remote_key = key
            self._remote[key] = cep

    def add_peer(self, cep: CepIo, svc_id: int) -> None:
        """A peer-to-peer REQ: a REQ to ``svc_id`` arriving while it waits meets it."""
        with self._lock:
            self._peers.setdefault(svc_id, []).append(cep)

    def _peer_for(self, svc_id: int, port: CmPort, sender: MadAddr) -> CepIo | None:
        """The peer-to-peer REQ of ours a REQ from ``sender`` on ``port`` meets."""
        live = [c for c in self._peers.get(svc_id, ())
                if self._ceps.get(c.local_comm_id) is c
                and c.state in (fsm.CmState.REQ_SENT, fsm.CmState.MRA_REQ_RCVD)]  # fmt: skip
        match = next((c for c in live if c.port is port and _same_sender(c.addr, sender)), None)
        rest = [c for c in live if c is not match]
        if rest:
            self._peers[svc_id] = rest
        else:
            self._peers.pop(svc_id, None)
        return match

    def find(self, local_comm_id: int) -> CepIo | None:
        return self._ceps.get(local_comm_id)

    def run(self, cep: CepIo, event: Any) -> None:
        """Feed one event to ``cep``'s machine and carry out its actions, in order."""
        with self._lock:
            if self._ceps.get(cep.local_comm_id) is not cep:
                if isinstance(event, fsm.TimerFired | fsm.RecvMsg | fsm.Destroy):
                    return  # released meanwhile
                raise InvalidState("the connection is closed")
            if isinstance(event, fsm.RecvMsg):
                cep.fields[event.attr] = dict(event.fields)
                if event.attr in _OPENERS:
                    cep.tid = self._rx_tid
            actions = cep.machine.handle(event, cep.port.now())
            for a in actions:
                self._act(cep, a)

    def _act(self, cep: CepIo, a: Any) -> None:
        kind = type(a)
        if kind is fsm.Transmit:
            if a.attr in _OPENERS:
                cep.tid = form_tid(cep.port.hi_tid, cep.local_comm_id)
            if not cep.port.alive or not cep.port.send(a.attr, cep.tid, a.msg, cep.addr):
                self.stats["send_failed"] += 1  # the retry timer (if any) tries again
        elif kind is fsm.ArmTimer:
            cep.generation = a.generation
            cep.port.arm(cep, a.at)
        elif kind is fsm.CancelTimer:
            cep.port.arm(cep, None)
        elif kind is fsm.Upcall:
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
        for k in [k for k, v in self._by_qp.items() if v is cep]:
            del self._by_qp[k]

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

    # ------------------------------------------------------------------ MADs in
    _rx_tid = 0  # the TID of the MAD being routed (under the lock)

    def _on_mad(self, port: CmPort, mad: bytes, addr: MadAddr) -> None:
        """Misc queue: one CM MAD arrived on ``port``."""
        try:
            msg = cmw.parse_cm(mad)
        except FieldError as exc:
            self.stats["dropped: malformed"] += 1
            log.debug("CM: malformed MAD dropped: %s", exc)
            return
        if mad[3] != Method.SEND:
            self.stats["dropped: not a Send"] += 1
            return
        data = bytes(mad[24:256])
        with self._lock:
            self._rx_tid = msg.tid
            try:
                self._route(port, msg, data, addr)
            except (IbError, FieldError, ValueError) as exc:
                self.stats["dropped: refused"] += 1
                log.debug("CM: %s dropped: %s", msg.attr.name, exc)

    def _route(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr) -> None:
        f, attr = msg.fields, msg.attr
        if attr is CmAttr.REQ:
            self._on_req(port, msg, data, addr)
            return
        if attr is CmAttr.SIDR_REQ:
            self._on_sidr_req(port, msg, data, addr)
            return
        if attr is CmAttr.SIDR_REP:
            cep = self._ceps.get(_int(f["request_id"]))
            if cep is None or not cep.sidr or not _same_sender(cep.addr, addr):
                self.stats["dropped: unknown SIDR request ID"] += 1
                return
            self.run(cep, fsm.RecvMsg(attr, data, f))
            return
        cep = self._ceps.get(_int(f["remote_comm_id"]))
        if cep is None or cep.sidr:
            self.stats["dropped: unknown comm ID"] += 1
            return
        sender = _int(f["local_comm_id"])
        if cep.remote_comm_id is None and attr in _FIRST_ANSWERS:
            pass  # the peer's comm ID is learnt from this message
        elif cep.remote_comm_id != sender:
            self.stats["dropped: wrong remote comm ID"] += 1
            return
        if not _same_sender(cep.addr, addr):
            self.stats["dropped: wrong sender"] += 1
            return
        if attr is CmAttr.REP and cep.remote_comm_id is None:
            cep.remote_comm_id = sender
            cep.remote_ca_guid = _int(f["local_ca_guid"])
            self.bind_remote(cep, ("conn", sender, cep.remote_ca_guid))
            if self._stale(cep.remote_ca_guid, _int(f["local_qpn"]), cep):
                return
        self.run(cep, fsm.RecvMsg(attr, data, f))

    def _stale(self, ca_guid: int, qpn: int, new: CepIo | None) -> bool:
        """A REQ or REP naming a remote QP another live connection of ours is bound to:
        that one is stale (IBA 12.9.8.3.2; it gets ``StaleConn``: DREQ or REJ).  True when
        the new message must be refused as well (a REQ: REJ StaleConn; a REP: its endpoint
        is stale too and the machine rejects it)."""
        key = (ca_guid, qpn)
        old = self._by_qp.get(key)
        if new is not None:
            self._by_qp[key] = new
        if old is None or old is new or self._ceps.get(old.local_comm_id) is not old or \
                old.state in (fsm.CmState.TIMEWAIT, fsm.CmState.CLOSED):  # fmt: skip
            return False
        self.stats["stale connections"] += 1
        self.run(old, fsm.StaleConn())
        if new is not None:
            self.run(new, fsm.StaleConn())
        return True

    def _arrival(self, port: CmPort, pkey: int) -> Arrival:
        lid = 0
        with contextlib.suppress(IbError):
            lid = port.ca.query_port(port.port_num).lid
        return Arrival(port.ca_guid, port.port_guid, lid, pkey)

    def _on_req(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr) -> None:
        f = msg.fields
        sender = _int(f["local_comm_id"])
        key = ("conn", sender, _int(f["local_ca_guid"]))
        cep = self._remote.get(key)
        if cep is not None:  # a retransmission: the machine answers it
            if _same_sender(cep.addr, addr):
                self.run(cep, fsm.RecvMsg(CmAttr.REQ, data, f))
            else:
                self.stats["dropped: wrong sender"] += 1
            return
        if self._stale(_int(f["local_ca_guid"]), _int(f["local_qpn"]), None):
            self._reject_unheard(port, msg, addr, RejReason.STALE_CONN)
            return
        peer = self._peer_for(_int(f["service_id"]), port, addr)
        if peer is not None:  # two peer-to-peer REQs met: the machine picks the active side
            peer.remote_comm_id = sender
            peer.remote_ca_guid = _int(f["local_ca_guid"])
            self.bind_remote(peer, key)
            self.run(peer, fsm.RecvMsg(CmAttr.REQ, data, f))
            return
        pdata = bytes(f["private_data"])
        listen = self.listens.match(_int(f["service_id"]), pdata,
                                    self._arrival(port, _int(f["pkey"])))  # fmt: skip
        if listen is None:
            self._reject_unheard(port, msg, addr)
            return
        try:
            wire.check_req(f, port.ca.query_port(port.port_num))
        except wire.PathMismatch as exc:  # a REQ this port cannot take: REJ with the reason
            self._reject_unheard(port, msg, addr, exc.reason)
            return
        cep = self.new_cep(port, _passive, addr)
        cep.tid = msg.tid
        cep.remote_comm_id = sender
        cep.remote_ca_guid = _int(f["local_ca_guid"])
        self.bind_remote(cep, key)
        self._by_qp[(cep.remote_ca_guid, _int(f["local_qpn"]))] = cep
        cep.fields[CmAttr.REQ] = dict(f)
        user = cast_listen(listen).cm_incoming(cep, dict(f))
        if user is None:  # the listen is going away: as if nobody listened
            self._release(cep)
            self._reject_unheard(port, msg, addr)
            return
        cep.user = user
        self.run(cep, fsm.RecvMsg(CmAttr.REQ, data, f))

    def _reject_unheard(self, port: CmPort, msg: cmw.CmMessage, addr: MadAddr,
                        reason: RejReason = RejReason.INVALID_SERVICE_ID) -> None:  # fmt: skip
        """REJ "invalid service ID" for a REQ nobody listens for, or ``reason`` for one the
        port cannot take (no endpoint is kept)."""
        rej = cmw.REJ.encode({
            "local_comm_id": 0, "remote_comm_id": msg.fields["local_comm_id"],
            "message_rejected": MessageMraed.REQ, "reject_info_length": 0,
            "reason": reason, "ari": bytes(72),
            "private_data": bytes(cmw.PRIVATE_DATA_SIZE[CmAttr.REJ]),
        })  # fmt: skip
        if port.send(CmAttr.REJ, msg.tid, rej, addr):
            self.stats[f"rej: {reason.name}"] += 1

    def _on_sidr_req(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr
                     ) -> None:  # fmt: skip
        f = msg.fields
        key = ("sidr", _int(f["request_id"]), _sender_key(addr))
        cep = self._remote.get(key)
        if cep is not None:
            self.run(cep, fsm.RecvMsg(CmAttr.SIDR_REQ, data, f))
            return
        pdata = bytes(f["private_data"])
        listen = self.listens.match(_int(f["service_id"]), pdata,
                                    self._arrival(port, _int(f["pkey"])), ud=True)  # fmt: skip
        if listen is None:
            rep = cmw.SIDR_REP.encode({
                "request_id": f["request_id"], "status": cmw.SidrStatus.UNSUPPORTED,
                "additional_info_length": 0, "vendor_id_h": 0, "qpn": 0, "vendor_id_l": 0,
                "service_id": f["service_id"], "qkey": 0, "additional_info": bytes(72),
                "private_data": bytes(cmw.PRIVATE_DATA_SIZE[CmAttr.SIDR_REP]),
            })  # fmt: skip
            if port.send(CmAttr.SIDR_REP, msg.tid, rep, addr):
                self.stats["sidr_rep: unsupported"] += 1
            return
        rid = _int(f["request_id"])
        cep = self.new_cep(port, lambda _cid, now: _sidr_passive(rid, now), addr, sidr=True)
        cep.tid = msg.tid
        self.bind_remote(cep, key)
        cep.fields[CmAttr.SIDR_REQ] = dict(f)
        user = cast_listen(listen).cm_incoming(cep, dict(f))
        if user is None:
            self._release(cep)
            return
        cep.user = user
        self.run(cep, fsm.RecvMsg(CmAttr.SIDR_REQ, data, f))

    # ------------------------------------------------------------------ addresses
    def path_addr(self, port: CmPort, path: dict[str, Value]) -> MadAddr:
        """Where the CM of a path's destination is: its QP1, over the path (GRH on RoCE and
        off-subnet; P_Key index of the path's P_Key)."""
        pa = port.ca.query_port(port.port_num)
        dgid = _gid(path["dgid"])
        sgid = _gid(path["sgid"])
        hop = _int(path.get("hop_limit", 0))
        roce = port.link_layer is not LinkLayer.INFINIBAND
        grh = None
        if roce or hop > 1:
            sgid_index = next((e.index for e in pa.gid_table if e.gid == sgid), 0)
            grh = Grh(dgid=dgid, sgid_index=sgid_index, hop_limit=hop or 64,
                      traffic_class=_int(path.get("tclass", 0)),
                      flow_label=_int(path.get("flow_label", 0)))  # fmt: skip
        pkey = _int(path.get("p_key", DEFAULT_PKEY)) or DEFAULT_PKEY
        pkey_index = next((i for i, k in enumerate(pa.pkeys) if k & 0x7FFF == pkey & 0x7FFF), 0)
        return MadAddr(remote_qp=1, dlid=0 if roce else _int(path["dlid"]),
                       sl=_int(path.get("sl", 0)), pkey_index=pkey_index, grh=grh)  # fmt: skip


def _passive(comm_id: int, now: float) -> fsm.Cep:
    return fsm.Cep(comm_id, active=False, now=now)


def _sidr_passive(request_id: int, now: float) -> Any:
    """A responder's machine carries the requester's request ID (its SIDR_REP echoes it)."""
    from ibal.cm import sidr_fsm

    return sidr_fsm.SidrCep(request_id, active=False, now=now)


def cast_listen(listen: ListenLike) -> ListenUser:
    return listen  # type: ignore[return-value]


def _int(v: Value | None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidParameter(f"expected an int field, got {v!r}")
    return v


def _gid(v: object) -> Gid:
    if isinstance(v, Gid):
        return v
    if isinstance(v, bytes | bytearray) and len(v) == 16:
        return Gid(bytes(v))
    raise InvalidParameter(f"expected a GID, got {v!r}")


def _sender_key(addr: MadAddr) -> tuple[int, bytes]:
    return (addr.dlid, addr.grh.dgid.packed if addr.grh is not None else b"")


def _same_sender(expected: MadAddr, got: MadAddr) -> bool:
    """Whether a MAD from ``got`` may come from the peer reached at ``expected``."""
    if expected.grh is not None and got.grh is not None:
        return expected.grh.dgid == got.grh.dgid
    if expected.grh is None and got.grh is None:
        return expected.dlid == got.dlid
    return expected.dlid == got.dlid or expected.dlid in (0, 0xFFFF)
