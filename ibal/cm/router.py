"""Routing of received CM MADs: :class:`CmRouter`, one per :class:`~ibal.cm.service.CmAgent`.

Every CM MAD a port of the agent receives comes here (misc queue):

* a REQ or SIDR_REQ seen before (the sender's comm ID and CA GUID, or request
  ID and sender) goes to its endpoint; a new one meets a peer-to-peer REQ of
  ours, or goes to the listen of its service ID (``ibal.cm.dispatch``), which
  makes a passive endpoint for it; nobody listening: REJ "invalid service
  ID" (SIDR_REP "unsupported"), and no endpoint is kept;
* a REQ or REP naming a remote QP a live connection is bound to makes that
  connection stale (IBA 12.9.8.3.2);
* every other message goes to the endpoint whose local comm ID it names, when
  it comes from that endpoint's peer (its comm ID, its address).

Malformed and forged MADs are dropped and counted in the agent's ``stats``,
never raise.  The router holds the agent's lock while it routes and feeds
the machines through the agent's named interface (``find``, ``remote``,
``new_cep``, ``bind_remote``, ``peer_for``, ``run``, ``release``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ibal.cm import fsm, wire
from ibal.cm.dispatch import Arrival, as_int, same_sender, sender_key
from ibal.status import IbError
from ibal.types import MadAddr
from ibal.wire.fields import FieldError
from ibal.wire.mad import cm as cmw
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason
from ibal.wire.mad.consts import Method

if TYPE_CHECKING:
    from ibal.cm.port import CmPort
    from ibal.cm.service import CepIo, CmAgent, ListenUser

__all__ = ["CmRouter"]

log = logging.getLogger("ibal.cm")

# Messages that open an exchange: the endpoint answers with their TID.
OPENERS = frozenset({CmAttr.REQ, CmAttr.DREQ, CmAttr.LAP, CmAttr.SIDR_REQ})
# Messages whose sender's comm ID we may not know yet (the first answer to our REQ).
_FIRST_ANSWERS = frozenset({CmAttr.REP, CmAttr.REJ, CmAttr.MRA})


class CmRouter:
    """Where each received CM MAD goes (see the module docstring)."""

    def __init__(self, agent: CmAgent) -> None:
        self.agent = agent
        self.stats = agent.stats
        self._by_qp: dict[tuple[int, int], CepIo] = {}  # (remote CA GUID, QPN) -> endpoint

    def forget(self, cep: CepIo) -> None:
        """``cep`` was released (under the agent's lock): it is bound to no remote QP."""
        for k in [k for k, v in self._by_qp.items() if v is cep]:
            del self._by_qp[k]

    def on_mad(self, port: CmPort, mad: bytes, addr: MadAddr) -> None:
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
        with self.agent.lock:
            try:
                self._route(port, msg, data, addr)
            except (IbError, FieldError, ValueError) as exc:
                self.stats["dropped: refused"] += 1
                log.debug("CM: %s dropped: %s", msg.attr.name, exc)

    def _deliver(self, cep: CepIo, msg: cmw.CmMessage, data: bytes) -> None:
        """Feed the machine; a message that opens an exchange sets the TID answers echo."""
        if msg.attr in OPENERS:
            cep.tid = msg.tid
        self.agent.run(cep, fsm.RecvMsg(msg.attr, data, msg.fields))

    def _route(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr) -> None:
        f, attr = msg.fields, msg.attr
        if attr is CmAttr.REQ:
            self._on_req(port, msg, data, addr)
            return
        if attr is CmAttr.SIDR_REQ:
            self._on_sidr_req(port, msg, data, addr)
            return
        agent = self.agent
        if attr is CmAttr.SIDR_REP:
            cep = agent.find(as_int(f["request_id"]))
            if cep is None or not cep.sidr or not same_sender(cep.addr, addr):
                self.stats["dropped: unknown SIDR request ID"] += 1
                return
            self._deliver(cep, msg, data)
            return
        cep = agent.find(as_int(f["remote_comm_id"]))
        if cep is None or cep.sidr:
            if attr is CmAttr.DREQ:
                self._drep_unheard(port, msg, addr)
            else:
                self.stats["dropped: unknown comm ID"] += 1
            return
        sender = as_int(f["local_comm_id"])
        if cep.remote_comm_id is None and attr in _FIRST_ANSWERS:
            pass  # the peer's comm ID is learnt from this message
        elif cep.remote_comm_id != sender:
            self.stats["dropped: wrong remote comm ID"] += 1
            return
        if not same_sender(cep.addr, addr):
            self.stats["dropped: wrong sender"] += 1
            return
        if attr is CmAttr.REP and cep.remote_comm_id is None:
            cep.remote_comm_id = sender
            cep.remote_ca_guid = as_int(f["local_ca_guid"])
            agent.bind_remote(cep, ("conn", sender, cep.remote_ca_guid))
            if self._stale(cep.remote_ca_guid, as_int(f["local_qpn"]), cep):
                return
        self._deliver(cep, msg, data)

    def _stale(self, ca_guid: int, qpn: int, new: CepIo | None) -> bool:
        """A REQ or REP naming a remote QP another live connection of ours is bound to:
        that one is stale (IBA 12.9.8.3.2; it gets ``StaleConn``: DREQ or REJ).  True when
        the new message must be refused as well (a REQ: REJ StaleConn; a REP: its endpoint
        is stale too and the machine rejects it)."""
        key = (ca_guid, qpn)
        old = self._by_qp.get(key)
        if new is not None:
            self._by_qp[key] = new
        if old is None or old is new or self.agent.find(old.local_comm_id) is not old or \
                old.state in (fsm.CmState.TIMEWAIT, fsm.CmState.CLOSED):  # fmt: skip
            return False
        self.stats["stale connections"] += 1
        self.agent.run(old, fsm.StaleConn())
        if new is not None:
            self.agent.run(new, fsm.StaleConn())
        return True

    def _arrival(self, port: CmPort, pkey: int) -> Arrival:
        lid = 0
        with contextlib.suppress(IbError):
            lid = port.ca.query_port(port.port_num).lid
        return Arrival(port.ca_guid, port.port_guid, lid, pkey)

    def _on_req(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr) -> None:
        agent, f = self.agent, msg.fields
        sender = as_int(f["local_comm_id"])
        key = ("conn", sender, as_int(f["local_ca_guid"]))
        cep = agent.remote(key)
        if cep is not None:  # a retransmission: the machine answers it
            if same_sender(cep.addr, addr):
                self._deliver(cep, msg, data)
            else:
                self.stats["dropped: wrong sender"] += 1
            return
        if self._stale(as_int(f["local_ca_guid"]), as_int(f["local_qpn"]), None):
            self._reject_unheard(port, msg, addr, RejReason.STALE_CONN)
            return
        peer = agent.peer_for(as_int(f["service_id"]), port, addr)
        if peer is not None:  # two peer-to-peer REQs met: the machine picks the active side
            peer.remote_comm_id = sender
            peer.remote_ca_guid = as_int(f["local_ca_guid"])
            agent.bind_remote(peer, key)
            self._deliver(peer, msg, data)
            return
        pdata = bytes(f["private_data"])
        listen = agent.listens.match(as_int(f["service_id"]), pdata,
                                     self._arrival(port, as_int(f["pkey"])))  # fmt: skip
        if listen is None:
            self._reject_unheard(port, msg, addr)
            return
        try:
            wire.check_req(f, port.ca.query_port(port.port_num))
        except wire.PathMismatch as exc:  # a REQ this port cannot take: REJ with the reason
            self._reject_unheard(port, msg, addr, exc.reason)
            return
        if not _listen_user(listen).admits():  # its backlog is full: no endpoint at all
            self._reject_unheard(port, msg, addr, RejReason.NO_RESOURCES)
            return
        cep = agent.new_cep(port, _passive, addr)
        cep.tid = msg.tid
        cep.remote_comm_id = sender
        cep.remote_ca_guid = as_int(f["local_ca_guid"])
        agent.bind_remote(cep, key)
        self._by_qp[(cep.remote_ca_guid, as_int(f["local_qpn"]))] = cep
        cep.fields[CmAttr.REQ] = dict(f)
        user = _listen_user(listen).cm_incoming(cep, dict(f))
        if user is None:  # the listen is going away: as if nobody listened
            agent.release(cep)
            self._reject_unheard(port, msg, addr)
            return
        cep.user = user
        _listen_user(listen).track(cep, user, f)
        self._deliver(cep, msg, data)

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

    def _drep_unheard(self, port: CmPort, msg: cmw.CmMessage, addr: MadAddr) -> None:
        """DREP for a DREQ whose connection is gone (its timewait ended before the peer's
        resent DREQ came, our DREP having been lost), as Linux's cm_issue_drep does: else
        the peer resends its DREQ until its retries run out (15 x 6 s from Linux)."""
        drep = cmw.DREP.encode({
            "local_comm_id": msg.fields["remote_comm_id"],
            "remote_comm_id": msg.fields["local_comm_id"],
            "private_data": bytes(cmw.PRIVATE_DATA_SIZE[CmAttr.DREP]),
        })  # fmt: skip
        if port.send(CmAttr.DREP, msg.tid, drep, addr):
            self.stats["drep: unknown comm ID"] += 1

    def _on_sidr_req(self, port: CmPort, msg: cmw.CmMessage, data: bytes, addr: MadAddr
                     ) -> None:  # fmt: skip
        agent, f = self.agent, msg.fields
        key = ("sidr", as_int(f["request_id"]), sender_key(addr))
        cep = agent.remote(key)
        if cep is not None:
            self._deliver(cep, msg, data)
            return
        pdata = bytes(f["private_data"])
        listen = agent.listens.match(as_int(f["service_id"]), pdata,
                                     self._arrival(port, as_int(f["pkey"])), ud=True)  # fmt: skip
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
        rid = as_int(f["request_id"])
        cep = agent.new_cep(port, lambda _cid, now: _sidr_passive(rid, now), addr, sidr=True)
        cep.tid = msg.tid
        agent.bind_remote(cep, key)
        cep.fields[CmAttr.SIDR_REQ] = dict(f)
        user = _listen_user(listen).cm_incoming(cep, dict(f))
        if user is None:
            agent.release(cep)
            return
        cep.user = user
        self._deliver(cep, msg, data)


def _passive(comm_id: int, now: float) -> fsm.Cep:
    return fsm.Cep(comm_id, active=False, now=now)


def _sidr_passive(request_id: int, now: float) -> Any:
    """A responder's machine carries the requester's request ID (its SIDR_REP echoes it)."""
    from ibal.cm import sidr_fsm

    return sidr_fsm.SidrCep(request_id, active=False, now=now)


def _listen_user(listen: object) -> ListenUser:
    return listen  # type: ignore[return-value]
