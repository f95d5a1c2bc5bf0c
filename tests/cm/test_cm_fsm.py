"""ibal.cm.fsm: every transition of the CM connection machine, stepped by hand.

Messages are real 232-byte CM data areas encoded with the ``ibal.wire.mad.cm``
tables and decoded back the way the I/O layer does; timers are fired by
stepping ``now`` to the ``ArmTimer`` the machine asked for.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

from ibal.cm.fsm import (
    LAP_TRANSITIONS,
    TRANSITIONS,
    Action,
    ArmTimer,
    CancelTimer,
    Cep,
    CmState,
    Deliver,
    Destroy,
    Drop,
    EnterTimewait,
    Event,
    LapState,
    ModifyQp,
    QpEstablished,
    RecvMsg,
    Release,
    SendApr,
    SendDrep,
    SendDreq,
    SendLap,
    SendMra,
    SendRej,
    SendRep,
    SendReq,
    SendRtu,
    StaleConn,
    TimerFired,
    Transmit,
    UpcallKind,
    build_rej,
    cm_ms,
    retransmit_ms,
)
from ibal.status import InvalidParameter, InvalidState, Status, Unsupported
from ibal.types import QpState
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason

S = CmState
A_ID, P_ID = 0x6EC0C56D, 0x1234ABCD  # comm IDs: active, passive
A_GUID, P_GUID = 0x0002C90300AA0001, 0x0002C90300BB0002
A_QPN, P_QPN = 0x000111, 0x000222
ACK = 17  # the captured REQ's local ACK timeout (roce-wire.md 3.4): TIMEWAIT 512 ms
TIMEWAIT_S = cm_ms(ACK) / 1000
RTX_MS = retransmit_ms(16, 20)  # 2*256 + 4096 = 4608 ms (roce-wire.md 3.5)
RTX_S = RTX_MS / 1000

# (from, trigger, to) of every transition taken by any Drive: the coverage test reads it.
SEEN: set[tuple[Any, str, Any]] = set()


def encode(attr: CmAttr, **kw: Any) -> bytes:
    return cm.TABLES[attr].encode(kw)


def recv(attr: CmAttr, **kw: Any) -> RecvMsg:
    """A message as the I/O layer hands it over: bytes plus their decoded fields."""
    raw = encode(attr, **kw)
    return RecvMsg(attr, raw, cm.TABLES[attr].decode(raw))


def relay(t: Action) -> RecvMsg:
    """What the peer receives for one of our Transmit actions."""
    assert isinstance(t, Transmit)
    return RecvMsg(t.attr, t.msg, cm.TABLES[t.attr].decode(t.msg))


def req_msg(comm: int = A_ID, guid: int = A_GUID, qpn: int = A_QPN) -> bytes:
    return encode(
        CmAttr.REQ, local_comm_id=comm, service_id=0x0000000001061C06, local_ca_guid=guid,
        local_qpn=qpn, starting_psn=0x1000, remote_cm_response_timeout=20,
        local_cm_response_timeout=20, max_cm_retries=2, primary_local_lid=0xFFFF,
        primary_remote_lid=0xFFFF, primary_hop_limit=64, primary_local_ack_timeout=ACK,
        private_data=bytes(92),
    )  # fmt: skip


def rep_msg(comm: int = P_ID, remote: int = A_ID, guid: int = P_GUID, qpn: int = P_QPN) -> bytes:
    return encode(CmAttr.REP, local_comm_id=comm, remote_comm_id=remote, local_ca_guid=guid,
                  local_qpn=qpn, starting_psn=0x2000, target_ack_delay=15)  # fmt: skip


def rtu_msg(comm: int = A_ID, remote: int = P_ID) -> bytes:
    return encode(CmAttr.RTU, local_comm_id=comm, remote_comm_id=remote)


def mra_msg(comm: int, remote: int, what: MessageMraed, timeout: int = 24) -> bytes:
    return encode(CmAttr.MRA, local_comm_id=comm, remote_comm_id=remote, message_mraed=what,
                  service_timeout=timeout)  # fmt: skip


def dreq_msg(comm: int, remote: int, qpn: int) -> bytes:
    return encode(CmAttr.DREQ, local_comm_id=comm, remote_comm_id=remote, remote_qpn=qpn)


def drep_msg(comm: int, remote: int) -> bytes:
    return encode(CmAttr.DREP, local_comm_id=comm, remote_comm_id=remote)


def rej_msg(comm: int, remote: int, reason: RejReason = RejReason.CONSUMER_DEFINED) -> bytes:
    return build_rej(comm, remote, reason, MessageMraed.REQ)


def lap_msg(comm: int = A_ID, remote: int = P_ID) -> bytes:
    return encode(CmAttr.LAP, local_comm_id=comm, remote_comm_id=remote, remote_qpn=P_QPN,
                  alternate_local_lid=0xFFFF, alternate_local_ack_timeout=ACK)  # fmt: skip


def apr_msg(comm: int = P_ID, remote: int = A_ID) -> bytes:
    return encode(CmAttr.APR, local_comm_id=comm, remote_comm_id=remote)


def as_recv(raw: bytes, attr: CmAttr) -> RecvMsg:
    return RecvMsg(attr, raw, cm.TABLES[attr].decode(raw))


class Drive:
    """Feeds one Cep like the I/O layer: keeps the clock and the timer it was asked for."""

    def __init__(self, cep: Cep, now: float = 0.0) -> None:
        self.cep = cep
        self.now = now
        self.timer: ArmTimer | None = None

    def __call__(self, ev: Event, at: float | None = None) -> list[Action]:
        if at is not None:
            self.now = at
        acts = self.cep.handle(ev, self.now)
        for a in acts:
            if isinstance(a, ArmTimer):
                self.timer = a
            elif isinstance(a, CancelTimer | Release):
                self.timer = None
        if self.cep.last_transition is not None:
            SEEN.add(self.cep.last_transition)
            self.cep.last_transition = None
        return acts

    def fire(self) -> list[Action]:
        """Step the clock to the armed timer and deliver it."""
        t = self.timer
        assert t is not None, "no timer armed"
        self.timer = None
        return self(TimerFired(t.generation), at=t.at)


def fields_of(t: Action) -> dict[str, Any]:
    assert isinstance(t, Transmit)
    return cm.TABLES[t.attr].decode(t.msg)


def active(retries: int = 2, p2p: bool = False) -> Drive:
    """An active endpoint that sent its REQ at t=0."""
    d = Drive(Cep(A_ID, active=True, now=0.0))
    d(SendReq(req_msg(), RTX_MS, retries, peer_to_peer=p2p))
    return d


def active_rep_rcvd() -> Drive:
    d = active()
    d(as_recv(rep_msg(), CmAttr.REP))
    return d


def active_established() -> Drive:
    d = active_rep_rcvd()
    d(SendRtu(rtu_msg()))
    return d


def passive() -> Drive:
    """A passive endpoint that received the REQ."""
    d = Drive(Cep(P_ID, active=False, now=0.0))
    d(as_recv(req_msg(), CmAttr.REQ))
    return d


def passive_rep_sent(retries: int = 2) -> Drive:
    d = passive()
    d(SendRep(rep_msg(), RTX_MS, retries))
    return d


def passive_established() -> Drive:
    d = passive_rep_sent()
    d(as_recv(rtu_msg(), CmAttr.RTU))
    return d


# ---------------------------------------------------------------- active establishment


def test_active_connect_req_rep_rtu() -> None:
    d = Drive(Cep(A_ID, active=True, now=0.0))
    assert d.cep.state is S.IDLE
    acts = d(SendReq(req_msg(), RTX_MS, 2))
    assert acts == [Transmit(CmAttr.REQ, req_msg()), ArmTimer(RTX_S, d.cep.generation)]
    assert d.cep.state is S.REQ_SENT
    rep = as_recv(rep_msg(), CmAttr.REP)
    acts = d(rep, at=1.0)
    assert acts == [CancelTimer(), Deliver(UpcallKind.REP, CmAttr.REP, rep.fields, Status.SUCCESS)]
    assert (d.cep.state, d.cep.remote_comm_id, d.cep.remote_qpn) == (S.REP_RCVD, P_ID, P_QPN)
    assert d.cep.remote_ca_guid == P_GUID
    assert d(SendRtu(rtu_msg())) == [Transmit(CmAttr.RTU, rtu_msg())]
    assert d.cep.state is S.ESTABLISHED


def test_req_resent_each_timeout_then_rej_timeout_and_rep_upcall_timeout() -> None:
    d = active(retries=2)
    for n in (1, 2):
        acts = d.fire()
        assert d.now == pytest.approx(n * RTX_S)
        assert acts[0] == Transmit(CmAttr.REQ, req_msg())
        assert isinstance(acts[1], ArmTimer) and acts[1].at == pytest.approx((n + 1) * RTX_S)
        assert d.cep.state is S.REQ_SENT
    acts = d.fire()
    rej = fields_of(acts[0])
    assert acts[0].attr is CmAttr.REJ  # type: ignore[union-attr]
    assert rej["reason"] == RejReason.TIMEOUT and rej["local_comm_id"] == A_ID
    assert rej["remote_comm_id"] == 0 and rej["message_rejected"] == MessageMraed.OTHER
    assert rej["reject_info_length"] == 8 and rej["ari"][:8] == A_GUID.to_bytes(8, "big")
    assert acts[1:] == [
        ModifyQp(QpState.ERROR), Deliver(UpcallKind.REP, None, None, Status.TIMEOUT), Release(),
    ]  # fmt: skip
    assert d.cep.state is S.CLOSED


def test_mra_of_req_stretches_the_timer_by_its_service_timeout() -> None:
    d = active(retries=1)
    mra = as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ, timeout=24), CmAttr.MRA)
    acts = d(mra, at=1.0)
    stretched = 1.0 + (cm_ms(24) + cm_ms(ACK)) / 1000  # 65.536 s + 0.512 s
    assert acts == [ArmTimer(stretched, d.cep.generation),
                    Deliver(UpcallKind.MRA, CmAttr.MRA, mra.fields, Status.SUCCESS)]  # fmt: skip
    assert d.cep.state is S.MRA_REQ_RCVD
    # the timer armed before the MRA is stale now
    assert d(TimerFired(d.cep.generation - 1), at=RTX_S) == []
    acts = d.fire()
    assert acts[0] == Transmit(CmAttr.REQ, req_msg()) and d.cep.state is S.MRA_REQ_RCVD
    assert isinstance(acts[1], ArmTimer) and acts[1].at == pytest.approx(2 * stretched - 1.0)
    acts = d.fire()
    assert fields_of(acts[0])["reason"] == RejReason.TIMEOUT
    assert Deliver(UpcallKind.REP, None, None, Status.TIMEOUT) in acts
    assert d.cep.state is S.CLOSED


def test_rep_after_mra_establishes() -> None:
    d = active()
    d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
    acts = d(as_recv(rep_msg(), CmAttr.REP))
    assert acts[0] == CancelTimer() and isinstance(acts[1], Deliver)
    assert d.cep.state is S.REP_RCVD
    d(SendMra(mra_msg(A_ID, P_ID, MessageMraed.REP)))
    assert d.cep.state is S.MRA_REP_SENT
    assert d(SendRtu(rtu_msg())) == [Transmit(CmAttr.RTU, rtu_msg())]
    assert d.cep.state is S.ESTABLISHED


def test_mra_naming_another_message_is_dropped() -> None:
    d = active()
    acts = d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REP), CmAttr.MRA))
    assert len(acts) == 1 and isinstance(acts[0], Drop) and "MRA" in acts[0].reason
    assert d.cep.state is S.REQ_SENT
    # a second MRA after the first is unexpected, not a second stretch
    d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
    acts = d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
    assert acts == [Drop("unexpected MRA in MRA(REQ) rcvd")]


def test_duplicate_rep_after_mra_sent_resends_the_mra() -> None:
    d = active_rep_rcvd()
    mra = mra_msg(A_ID, P_ID, MessageMraed.REP, timeout=20)
    d(SendMra(mra))
    assert d(as_recv(rep_msg(), CmAttr.REP)) == [Transmit(CmAttr.MRA, mra)]
    assert d.cep.state is S.MRA_REP_SENT


def test_rep_in_established_means_rtu_lost_resend_rtu() -> None:
    d = active_established()
    assert d(as_recv(rep_msg(), CmAttr.REP)) == [Transmit(CmAttr.RTU, rtu_msg())]
    assert d.cep.state is S.ESTABLISHED


def test_duplicate_rep_before_rtu_is_dropped() -> None:
    d = active_rep_rcvd()
    assert d(as_recv(rep_msg(), CmAttr.REP)) == [Drop("unexpected REP in REP rcvd")]


# ---------------------------------------------------------------- passive establishment


def test_passive_connect_req_mra_rep_rtu() -> None:
    d = Drive(Cep(P_ID, active=False, now=0.0))
    assert d.cep.state is S.LISTEN
    req = as_recv(req_msg(), CmAttr.REQ)
    assert d(req) == [Deliver(UpcallKind.REQ, CmAttr.REQ, req.fields, Status.SUCCESS)]
    assert (d.cep.state, d.cep.remote_comm_id, d.cep.remote_qpn) == (S.REQ_RCVD, A_ID, A_QPN)
    assert d.cep.timewait_ms == 512
    mra = mra_msg(P_ID, A_ID, MessageMraed.REQ)
    assert d(SendMra(mra)) == [Transmit(CmAttr.MRA, mra)]
    assert d.cep.state is S.MRA_REQ_SENT
    assert d(req) == [Transmit(CmAttr.MRA, mra)]  # duplicate REQ: the MRA again
    acts = d(SendRep(rep_msg(), RTX_MS, 2), at=2.0)
    assert acts == [Transmit(CmAttr.REP, rep_msg()), ArmTimer(2.0 + RTX_S, d.cep.generation)]
    assert d.cep.state is S.REP_SENT
    assert d(req) == [Transmit(CmAttr.REP, rep_msg())]  # duplicate REQ: the REP again
    rtu = as_recv(rtu_msg(), CmAttr.RTU)
    assert d(rtu) == [CancelTimer(), ModifyQp(QpState.RTS),
                      Deliver(UpcallKind.RTU, CmAttr.RTU, rtu.fields, Status.SUCCESS)]  # fmt: skip
    assert d.cep.state is S.ESTABLISHED


def test_duplicate_req_before_an_answer_is_dropped() -> None:
    d = passive()
    assert d(as_recv(req_msg(), CmAttr.REQ)) == [Drop("unexpected REQ in REQ rcvd")]


def test_rep_resent_then_rej_timeout_and_rtu_upcall_timeout() -> None:
    d = passive_rep_sent(retries=1)
    acts = d.fire()
    assert acts[0] == Transmit(CmAttr.REP, rep_msg()) and d.cep.state is S.REP_SENT
    acts = d.fire()
    rej = fields_of(acts[0])
    assert (rej["reason"], rej["local_comm_id"], rej["remote_comm_id"]) == (
        RejReason.TIMEOUT, P_ID, A_ID)  # fmt: skip
    assert rej["ari"][:8] == P_GUID.to_bytes(8, "big")
    assert acts[1:] == [
        ModifyQp(QpState.ERROR), Deliver(UpcallKind.RTU, None, None, Status.TIMEOUT), Release(),
    ]  # fmt: skip
    assert d.cep.state is S.CLOSED


def test_mra_of_rep_then_rtu_and_timeouts() -> None:
    d = passive_rep_sent(retries=1)
    mra = as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP, timeout=18), CmAttr.MRA)
    acts = d(mra, at=1.0)
    assert acts[0] == ArmTimer(1.0 + (cm_ms(18) + cm_ms(ACK)) / 1000, d.cep.generation)
    assert d.cep.state is S.MRA_REP_RCVD
    assert d.fire()[0] == Transmit(CmAttr.REP, rep_msg())
    acts = d.fire()
    assert Deliver(UpcallKind.RTU, None, None, Status.TIMEOUT) in acts
    assert d.cep.state is S.CLOSED
    d = passive_rep_sent()
    d(mra)
    acts = d(as_recv(rtu_msg(), CmAttr.RTU))
    assert acts[:2] == [CancelTimer(), ModifyQp(QpState.RTS)] and d.cep.state is S.ESTABLISHED


def test_data_before_rtu_establishes() -> None:
    for mra in (False, True):
        d = passive_rep_sent()
        if mra:
            d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
        acts = d(QpEstablished())
        assert acts == [CancelTimer(), ModifyQp(QpState.RTS),
                        Deliver(UpcallKind.RTU, None, None, Status.SUCCESS)]  # fmt: skip
        assert d.cep.state is S.ESTABLISHED
        # the RTU that follows is a duplicate; a later established event nothing
        assert d(QpEstablished()) == []
        assert d(as_recv(rtu_msg(), CmAttr.RTU)) == [Drop("unexpected RTU in established")]


def test_passive_ignores_rep_in_established() -> None:
    d = passive_established()
    assert d(as_recv(rep_msg(comm=A_ID, remote=P_ID), CmAttr.REP)) == [
        Drop("unexpected REP in established (passive side)")
    ]


# ---------------------------------------------------------------- rejects


def test_user_rej_before_rep_frees_without_timewait() -> None:
    rej = rej_msg(P_ID, A_ID)
    d = passive()
    assert d(SendRej(rej)) == [Transmit(CmAttr.REJ, rej), Release()]  # no QP bound yet
    assert d.cep.state is S.CLOSED
    d = passive()
    d(SendMra(mra_msg(P_ID, A_ID, MessageMraed.REQ)))
    assert d(SendRej(rej)) == [Transmit(CmAttr.REJ, rej), Release()]
    for s in ("rep_sent", "mra_rep_rcvd"):
        d = passive_rep_sent()
        if s == "mra_rep_rcvd":
            d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
        assert d(SendRej(rej)) == [CancelTimer(), Transmit(CmAttr.REJ, rej),
                                   ModifyQp(QpState.ERROR), Release()]  # fmt: skip
    arej = build_rej(A_ID, 0, RejReason.CONSUMER_DEFINED)
    for mra in (False, True):
        d = active()
        if mra:
            d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
        assert d(SendRej(arej)) == [CancelTimer(), Transmit(CmAttr.REJ, arej),
                                    ModifyQp(QpState.ERROR), Release()]  # fmt: skip


def test_user_rej_of_a_rep_enters_timewait() -> None:
    rej = build_rej(A_ID, P_ID, RejReason.CONSUMER_DEFINED, MessageMraed.REP)
    for mra in (False, True):
        d = active_rep_rcvd()
        if mra:
            d(SendMra(mra_msg(A_ID, P_ID, MessageMraed.REP)))
        acts = d(SendRej(rej), at=3.0)
        assert acts == [Transmit(CmAttr.REJ, rej), ModifyQp(QpState.ERROR),
                        EnterTimewait(3.0 + TIMEWAIT_S), ArmTimer(3.0 + TIMEWAIT_S,
                                                                   d.cep.generation)]  # fmt: skip
        assert d.cep.state is S.TIMEWAIT
        assert d.fire() == [Release()] and d.cep.state is S.CLOSED


@pytest.mark.parametrize("stale", [False, True])
def test_rej_received_before_establishment(stale: bool) -> None:
    reason = RejReason.STALE_CONN if stale else RejReason.NO_QP
    after = S.TIMEWAIT if stale else S.CLOSED

    def check(d: Drive, qp: bool, timer: bool) -> None:
        peer = P_ID if d.cep.active else A_ID
        rej = as_recv(build_rej(peer, d.cep.local_comm_id, reason, MessageMraed.REQ), CmAttr.REJ)
        acts = d(rej)
        want: list[Action] = [CancelTimer()] if timer else []
        want += [ModifyQp(QpState.ERROR)] if qp else []
        want.append(Deliver(UpcallKind.REJ, CmAttr.REJ, rej.fields, Status.SUCCESS))
        assert acts[: len(want)] == want
        assert acts[len(want)] == (EnterTimewait(d.now + TIMEWAIT_S) if stale else Release())
        assert d.cep.state is after

    check(active(), True, True)
    d = active()
    d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
    check(d, True, True)
    check(passive(), False, False)
    d = passive()
    d(SendMra(mra_msg(P_ID, A_ID, MessageMraed.REQ)))
    check(d, False, False)
    check(passive_rep_sent(), True, True)
    d = passive_rep_sent()
    d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
    check(d, True, True)


def test_rej_received_without_our_comm_id_only_for_timeout() -> None:
    # the active side gave up before seeing our REP: its REJ names no remote comm ID
    d = passive_rep_sent()
    acts = d(as_recv(build_rej(A_ID, 0, RejReason.TIMEOUT, ari=A_GUID.to_bytes(8, "big")),
                     CmAttr.REJ))  # fmt: skip
    assert isinstance(acts[2], Deliver) and d.cep.state is S.CLOSED
    d = passive_rep_sent()
    acts = d(as_recv(build_rej(A_ID, 0, RejReason.NO_QP), CmAttr.REJ))
    assert acts == [Drop(f"REJ for comm ID 0x0, this is {P_ID:#x}")]


@pytest.mark.parametrize("stale", [False, True])
def test_rej_received_after_rep_enters_timewait(stale: bool) -> None:
    reason = RejReason.STALE_CONN if stale else RejReason.TIMEOUT
    for make in ("rep_rcvd", "mra_rep_sent", "established"):
        d = active_established() if make == "established" else active_rep_rcvd()
        if make == "mra_rep_sent":
            d(SendMra(mra_msg(A_ID, P_ID, MessageMraed.REP)))
        rej = as_recv(build_rej(P_ID, A_ID, reason), CmAttr.REJ)
        acts = d(rej, at=5.0)
        assert acts == [ModifyQp(QpState.ERROR),
                        Deliver(UpcallKind.REJ, CmAttr.REJ, rej.fields, Status.SUCCESS),
                        EnterTimewait(5.0 + TIMEWAIT_S),
                        ArmTimer(5.0 + TIMEWAIT_S, d.cep.generation)]  # fmt: skip
        assert d.cep.state is S.TIMEWAIT


# ---------------------------------------------------------------- disconnect


def test_dreq_drep_timewait_release() -> None:
    d = active_established()
    dreq = dreq_msg(A_ID, P_ID, P_QPN)
    acts = d(SendDreq(dreq, RTX_MS, 2), at=10.0)
    assert acts == [Transmit(CmAttr.DREQ, dreq), ArmTimer(10.0 + RTX_S, d.cep.generation),
                    ModifyQp(QpState.ERROR)]  # fmt: skip
    assert d.cep.state is S.DREQ_SENT
    assert d.fire()[0] == Transmit(CmAttr.DREQ, dreq)  # resent
    drep = as_recv(drep_msg(P_ID, A_ID), CmAttr.DREP)
    acts = d(drep, at=12.0)
    assert acts == [CancelTimer(), Deliver(UpcallKind.DREP, CmAttr.DREP, drep.fields,
                                          Status.SUCCESS),
                    EnterTimewait(12.0 + TIMEWAIT_S),
                    ArmTimer(12.0 + TIMEWAIT_S, d.cep.generation)]  # fmt: skip
    assert d.cep.state is S.TIMEWAIT
    assert d(drep) == []  # a late second DREP
    assert d.fire() == [Release()]
    assert d.cep.state is S.CLOSED and d.now == pytest.approx(12.0 + TIMEWAIT_S)


def test_dreq_timeout_gives_drep_upcall_timeout_and_timewait() -> None:
    d = active_established()
    d(SendDreq(dreq_msg(A_ID, P_ID, P_QPN), RTX_MS, 1), at=0.0)
    d.fire()
    acts = d.fire()
    assert acts[0] == Deliver(UpcallKind.DREP, None, None, Status.TIMEOUT)
    assert isinstance(acts[1], EnterTimewait) and d.cep.state is S.TIMEWAIT


def test_dreq_received_drep_sent_and_duplicate_dreq_in_timewait_resends_it() -> None:
    d = passive_established()
    dreq = as_recv(dreq_msg(A_ID, P_ID, P_QPN), CmAttr.DREQ)
    acts = d(dreq)
    assert acts == [ModifyQp(QpState.ERROR),
                    Deliver(UpcallKind.DREQ, CmAttr.DREQ, dreq.fields, Status.SUCCESS)]  # fmt: skip
    assert d.cep.state is S.DREQ_RCVD
    assert d(dreq) == [Drop("unexpected DREQ in DREQ rcvd")]  # answer pending
    drep = drep_msg(P_ID, A_ID)[:8] + b"\x42" * 224  # our own private data
    acts = d(SendDrep(drep), at=1.0)
    assert acts[:2] == [Transmit(CmAttr.DREP, drep), EnterTimewait(1.0 + TIMEWAIT_S)]
    assert d(dreq) == [Transmit(CmAttr.DREP, drep)]  # the same DREP again
    assert d.cep.state is S.TIMEWAIT


def test_dreq_for_another_qpn_is_dropped() -> None:
    d = passive_established()
    acts = d(as_recv(dreq_msg(A_ID, P_ID, 0x999), CmAttr.DREQ))
    assert acts == [Drop(f"DREQ for QPN 0x999, this connection's is {P_QPN:#x}")]
    assert d.cep.state is S.ESTABLISHED


def test_dreq_while_waiting_for_rtu() -> None:
    for mra in (False, True):
        d = passive_rep_sent()
        if mra:
            d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
        acts = d(as_recv(dreq_msg(A_ID, P_ID, P_QPN), CmAttr.DREQ))
        assert acts[:2] == [CancelTimer(), ModifyQp(QpState.ERROR)]
        assert d.cep.state is S.DREQ_RCVD


def test_crossing_dreqs_both_answer_and_enter_timewait() -> None:
    a, p = active_established(), passive_established()
    a_dreq = a(SendDreq(dreq_msg(A_ID, P_ID, P_QPN), RTX_MS, 2))[0]
    p_dreq = p(SendDreq(dreq_msg(P_ID, A_ID, A_QPN), RTX_MS, 2))[0]
    a_acts = a(relay(p_dreq))
    p_acts = p(relay(a_dreq))
    for d, acts, peer in ((a, a_acts, P_ID), (p, p_acts, A_ID)):
        assert acts[0] == CancelTimer()
        drep = fields_of(acts[1])
        assert acts[1].attr is CmAttr.DREP  # type: ignore[union-attr]
        assert (drep["local_comm_id"], drep["remote_comm_id"]) == (d.cep.local_comm_id, peer)
        assert isinstance(acts[2], Deliver) and acts[2].kind is UpcallKind.DREP
        assert acts[2].status is Status.SUCCESS and acts[2].attr is CmAttr.DREQ
        assert isinstance(acts[3], EnterTimewait) and d.cep.state is S.TIMEWAIT
    # each DREP lands in TIMEWAIT: nothing more to do
    assert a(relay(p_acts[1])) == [] and p(relay(a_acts[1])) == []
    # a duplicate DREQ is answered by the DREP sent
    assert a(relay(p_dreq)) == [a_acts[1]]


def test_dup_dreq_in_timewait_after_our_dreq_builds_a_drep() -> None:
    d = active_established()
    d(SendDreq(dreq_msg(A_ID, P_ID, P_QPN), RTX_MS, 2))
    d(as_recv(drep_msg(P_ID, A_ID), CmAttr.DREP))
    acts = d(as_recv(dreq_msg(P_ID, A_ID, A_QPN), CmAttr.DREQ))
    assert [fields_of(acts[0])[k] for k in ("local_comm_id", "remote_comm_id")] == [A_ID, P_ID]


# ---------------------------------------------------------------- stale connections


def test_stale_established_connection_is_disconnected() -> None:
    d = passive_established()
    acts = d(StaleConn(), at=7.0)
    dreq = fields_of(acts[0])
    assert (dreq["local_comm_id"], dreq["remote_comm_id"], dreq["remote_qpn"]) == (
        P_ID, A_ID, A_QPN)  # fmt: skip
    assert acts[1:] == [ArmTimer(7.0 + RTX_S, d.cep.generation), ModifyQp(QpState.ERROR),
                        Deliver(UpcallKind.STALE, None, None, Status.SUCCESS)]  # fmt: skip
    assert d.cep.state is S.DREQ_SENT
    assert d.fire()[0] == acts[0]  # the machine's DREQ is retransmitted like the user's


def test_stale_half_open_connection_is_rejected() -> None:
    cases = []
    for mra in (False, True):
        d = passive_rep_sent()
        if mra:
            d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
        cases.append((d, MessageMraed.OTHER, A_ID))
        d = active_rep_rcvd()
        if mra:
            d(SendMra(mra_msg(A_ID, P_ID, MessageMraed.REP)))
        cases.append((d, MessageMraed.REP, P_ID))
    for d, rejected, peer in cases:
        acts = d(StaleConn())
        rej = next(fields_of(a) for a in acts if isinstance(a, Transmit))
        assert (rej["reason"], rej["message_rejected"], rej["remote_comm_id"]) == (
            RejReason.STALE_CONN, rejected, peer)  # fmt: skip
        assert Deliver(UpcallKind.STALE, None, None, Status.SUCCESS) in acts
        assert ModifyQp(QpState.ERROR) in acts and d.cep.state is S.TIMEWAIT


def test_stale_with_nothing_to_do() -> None:
    d = active()
    assert d(StaleConn()) == [] and d.cep.state is S.REQ_SENT


def test_req_reusing_a_connection_in_timewait_gets_rej_stale() -> None:
    d = passive_established()
    d(as_recv(dreq_msg(A_ID, P_ID, P_QPN), CmAttr.DREQ))
    d(SendDrep(drep_msg(P_ID, A_ID)))
    acts = d(as_recv(req_msg(), CmAttr.REQ))
    rej = fields_of(acts[0])
    assert (
        rej["reason"],
        rej["message_rejected"],
        rej["local_comm_id"],
        rej["remote_comm_id"],
    ) == (RejReason.STALE_CONN, MessageMraed.REQ, P_ID, A_ID)
    assert d.cep.state is S.TIMEWAIT


# ---------------------------------------------------------------- peer-to-peer


def test_peer_to_peer_crossing_reqs_smaller_side_becomes_passive() -> None:
    hi = Drive(Cep(A_ID, active=True, now=0.0))
    lo = Drive(Cep(P_ID, active=True, now=0.0))
    hi_req = hi(SendReq(req_msg(A_ID, guid=0x20, qpn=5), RTX_MS, 2, peer_to_peer=True))[0]
    lo_req = lo(SendReq(req_msg(P_ID, guid=0x10, qpn=9), RTX_MS, 2, peer_to_peer=True))[0]
    assert hi(relay(lo_req)) == []  # greater CA GUID: stays active, ignores the REQ
    assert hi.cep.state is S.REQ_SENT and hi.cep.active
    acts = lo(relay(hi_req))
    assert acts[0] == CancelTimer() and isinstance(acts[1], Deliver)
    assert acts[1].kind is UpcallKind.REQ
    assert lo.cep.state is S.REQ_RCVD and not lo.cep.active and lo.cep.remote_comm_id == A_ID
    rep = lo(SendRep(rep_msg(P_ID, A_ID, guid=0x10, qpn=9), RTX_MS, 2))[0]
    assert hi(relay(rep))[1].kind is UpcallKind.REP  # type: ignore[union-attr]
    rtu = hi(SendRtu(rtu_msg()))[0]
    lo(relay(rtu))
    assert hi.cep.state is S.ESTABLISHED and lo.cep.state is S.ESTABLISHED
    # the side that became passive may not send LAP
    with pytest.raises(Unsupported):
        lo(SendLap(lap_msg(P_ID, A_ID), RTX_MS, 1))


def test_peer_to_peer_same_guid_compares_qpn() -> None:
    d = active(p2p=True)  # A_GUID, A_QPN
    acts = d(as_recv(req_msg(P_ID, guid=A_GUID, qpn=A_QPN + 1), CmAttr.REQ))
    assert d.cep.state is S.REQ_RCVD and isinstance(acts[-1], Deliver)
    d = active(p2p=True)
    assert d(as_recv(req_msg(P_ID, guid=A_GUID, qpn=A_QPN - 1), CmAttr.REQ)) == []
    acts = d(as_recv(req_msg(P_ID, guid=A_GUID, qpn=A_QPN), CmAttr.REQ))
    assert acts == [Drop("peer-to-peer REQ from this endpoint's own QP")]


def test_req_to_a_client_server_active_side_is_dropped() -> None:
    d = active()
    acts = d(as_recv(req_msg(P_ID, guid=1, qpn=1), CmAttr.REQ))
    assert acts == [Drop("REQ for an active endpoint that is not peer-to-peer")]


# ---------------------------------------------------------------- LAP / APR


def test_lap_sent_resent_mra_stretched_then_apr() -> None:
    d = active_established()
    lap = lap_msg()
    acts = d(SendLap(lap, RTX_MS, 2), at=20.0)
    assert acts == [Transmit(CmAttr.LAP, lap), ArmTimer(20.0 + RTX_S, d.cep.generation)]
    assert (d.cep.state, d.cep.lap_state) == (S.ESTABLISHED, LapState.LAP_SENT)
    assert d.fire()[0] == Transmit(CmAttr.LAP, lap)
    mra = as_recv(mra_msg(P_ID, A_ID, MessageMraed.LAP, timeout=20), CmAttr.MRA)
    acts = d(mra, at=30.0)
    assert acts[0] == ArmTimer(30.0 + (cm_ms(20) + cm_ms(ACK)) / 1000, d.cep.generation)
    assert d.cep.lap_state is LapState.MRA_LAP_RCVD
    assert d.fire()[0] == Transmit(CmAttr.LAP, lap)
    apr = as_recv(apr_msg(), CmAttr.APR)
    assert d(apr) == [CancelTimer(), Deliver(UpcallKind.APR, CmAttr.APR, apr.fields,
                                            Status.SUCCESS)]  # fmt: skip
    assert (d.cep.state, d.cep.lap_state) == (S.ESTABLISHED, LapState.IDLE)
    d(SendLap(lap, RTX_MS, 2))
    assert d(apr)[0] == CancelTimer() and d.cep.lap_state is LapState.IDLE


def test_lap_timeout_gives_apr_upcall_timeout_connection_stays() -> None:
    for mra in (False, True):
        d = active_established()
        d(SendLap(lap_msg(), RTX_MS, 0))
        if mra:
            d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.LAP), CmAttr.MRA))
        assert d.fire() == [Deliver(UpcallKind.APR, None, None, Status.TIMEOUT)]
        assert (d.cep.state, d.cep.lap_state) == (S.ESTABLISHED, LapState.IDLE)


def test_lap_received_mra_duplicate_apr() -> None:
    d = passive_established()
    lap = as_recv(lap_msg(), CmAttr.LAP)
    assert d(lap) == [Deliver(UpcallKind.LAP, CmAttr.LAP, lap.fields, Status.SUCCESS)]
    assert d.cep.lap_state is LapState.LAP_RCVD
    assert d(lap) == [Drop("unexpected LAP in established (LAP rcvd)")]
    mra = mra_msg(P_ID, A_ID, MessageMraed.LAP)
    assert d(SendMra(mra)) == [Transmit(CmAttr.MRA, mra)]
    assert d(lap) == [Transmit(CmAttr.MRA, mra)]
    assert d(SendApr(apr_msg())) == [Transmit(CmAttr.APR, apr_msg())]
    assert d.cep.lap_state is LapState.IDLE
    d(lap)
    assert d(SendApr(apr_msg())) == [Transmit(CmAttr.APR, apr_msg())]


def test_dreq_during_lap_cancels_it() -> None:
    d = active_established()
    d(SendLap(lap_msg(), RTX_MS, 2))
    acts = d(as_recv(dreq_msg(P_ID, A_ID, A_QPN), CmAttr.DREQ))
    assert acts[0] == CancelTimer()
    assert (d.cep.state, d.cep.lap_state) == (S.DREQ_RCVD, LapState.IDLE)


def test_lap_from_passive_side_unsupported_apr_without_lap_invalid() -> None:
    d = passive_established()
    with pytest.raises(Unsupported, match="active side"):
        d(SendLap(lap_msg(P_ID, A_ID), RTX_MS, 2))
    with pytest.raises(InvalidState, match=r"send APR in state established"):
        d(SendApr(apr_msg()))
    assert d.cep.lap_state is LapState.IDLE


# ---------------------------------------------------------------- destroy


def test_destroy_leaves_politely_without_upcalls() -> None:
    d = Drive(Cep(A_ID, active=True, now=0.0))
    assert d(Destroy()) == [Release()] and d.cep.state is S.CLOSED
    d = Drive(Cep(P_ID, active=False, now=0.0))
    assert d(Destroy()) == [Release()]
    assert d(Destroy()) == []  # nothing left
    for mra in (False, True):  # waiting for a REP: REJ(Timeout), as the kernel does
        d = active()
        if mra:
            d(as_recv(mra_msg(P_ID, A_ID, MessageMraed.REQ), CmAttr.MRA))
        acts = d(Destroy())
        assert fields_of(acts[1])["reason"] == RejReason.TIMEOUT
        assert acts[2:] == [ModifyQp(QpState.ERROR), Release()]
    for make, rejected in ((passive, MessageMraed.REQ), (passive_rep_sent, MessageMraed.OTHER),
                           (active_rep_rcvd, MessageMraed.REP)):  # fmt: skip
        for mra in (False, True):
            d = make()
            if mra and make is passive:
                d(SendMra(mra_msg(P_ID, A_ID, MessageMraed.REQ)))
            elif mra and make is passive_rep_sent:
                d(as_recv(mra_msg(A_ID, P_ID, MessageMraed.REP), CmAttr.MRA))
            elif mra:
                d(SendMra(mra_msg(A_ID, P_ID, MessageMraed.REP)))
            acts = d(Destroy())
            rej = next(fields_of(a) for a in acts if isinstance(a, Transmit))
            assert (rej["reason"], rej["message_rejected"]) == (
                RejReason.CONSUMER_DEFINED, rejected)  # fmt: skip
            assert not any(isinstance(a, Deliver) for a in acts)
            assert d.cep.state is (S.TIMEWAIT if make is active_rep_rcvd else S.CLOSED)


def test_destroy_established_sends_dreq_and_mutes_the_drep() -> None:
    d = active_established()
    acts = d(Destroy())
    assert fields_of(acts[0])["remote_qpn"] == P_QPN and d.cep.state is S.DREQ_SENT
    assert d(Destroy()) == []
    acts = d(as_recv(drep_msg(P_ID, A_ID), CmAttr.DREP))
    assert not any(isinstance(a, Deliver) for a in acts) and d.cep.state is S.TIMEWAIT
    assert d(Destroy()) == []
    assert d.fire() == [Release()]


def test_destroy_with_a_dreq_pending_answers_it() -> None:
    d = passive_established()
    d(as_recv(dreq_msg(A_ID, P_ID, P_QPN), CmAttr.DREQ))
    acts = d(Destroy())
    assert fields_of(acts[0])["remote_comm_id"] == A_ID and acts[0].attr is CmAttr.DREP  # type: ignore[union-attr]
    assert d.cep.state is S.TIMEWAIT


# ---------------------------------------------------------------- refusals and drops


def test_api_call_in_the_wrong_state_raises_invalid_state_naming_it() -> None:
    d = Drive(Cep(A_ID, active=True, now=0.0))
    with pytest.raises(InvalidState, match="cannot send RTU in state idle"):
        d(SendRtu(rtu_msg()))
    d = active_established()
    with pytest.raises(InvalidState, match="cannot send REQ in state established"):
        d(SendReq(req_msg(), RTX_MS, 2))
    with pytest.raises(InvalidState, match="cannot send REJ in state established"):
        d(SendRej(rej_msg(A_ID, P_ID)))
    assert d.cep.state is S.ESTABLISHED
    d = passive_rep_sent()
    with pytest.raises(InvalidState, match="REP sent"):
        d(SendRep(rep_msg(), RTX_MS, 2))
    with pytest.raises(InvalidState, match="DREQ"):
        d(SendDreq(dreq_msg(P_ID, A_ID, A_QPN), RTX_MS, 2))


def test_api_message_checked() -> None:
    d = Drive(Cep(A_ID, active=True, now=0.0))
    with pytest.raises(InvalidParameter, match="232 bytes"):
        d(SendReq(req_msg()[:100], RTX_MS, 2))
    with pytest.raises(InvalidParameter, match="local comm ID 0x5"):
        d(SendReq(req_msg(comm=5), RTX_MS, 2))
    assert d.cep.state is S.IDLE


def test_unexpected_and_misaddressed_messages_are_dropped_never_raised() -> None:
    d = active_established()
    assert d(as_recv(rtu_msg(P_ID, A_ID), CmAttr.RTU)) == [Drop("unexpected RTU in established")]
    assert d(as_recv(dreq_msg(P_ID, 0x77, A_QPN), CmAttr.DREQ)) == [
        Drop(f"DREQ for comm ID 0x77, this is {A_ID:#x}")
    ]
    assert d(as_recv(dreq_msg(0x55, A_ID, A_QPN), CmAttr.DREQ)) == [
        Drop(f"DREQ from comm ID 0x55, peer is {P_ID:#x}")
    ]
    assert d(as_recv(encode(CmAttr.APR, local_comm_id=P_ID, remote_comm_id=A_ID),
                     CmAttr.APR)) == [Drop("unexpected APR in established")]  # fmt: skip
    assert d.cep.state is S.ESTABLISHED
    closed = Drive(Cep(A_ID, active=False, now=0.0))
    closed(Destroy())
    for attr in (CmAttr.REQ, CmAttr.REP, CmAttr.DREQ):
        assert closed(recv(attr)) == [Drop(f"unexpected {attr.name} in closed")]
    with pytest.raises(InvalidState, match="closed"):
        closed(SendDrep(drep_msg(A_ID, P_ID)))
    # a timer of an earlier generation, or with nothing armed, does nothing
    assert closed(TimerFired(0)) == [] and closed(QpEstablished()) == []


# ---------------------------------------------------------------- both machines talking


def test_two_machines_connect_and_disconnect_over_a_lossy_wire() -> None:
    """Active and passive exchange every message through relay(); the RTU is lost once."""
    a = Drive(Cep(A_ID, active=True, now=0.0))
    p = Drive(Cep(P_ID, active=False, now=0.0))
    req = a(SendReq(req_msg(), RTX_MS, 3))[0]
    p(relay(req))
    rep = p(SendRep(rep_msg(), RTX_MS, 3))[0]
    a(relay(rep))
    a(SendRtu(rtu_msg()))  # ... and this RTU is lost
    resent_rep = p.fire()[0]
    assert resent_rep == rep
    rtu = a(relay(resent_rep), at=p.now)[0]  # established side answers a REP with the RTU
    assert p(relay(rtu))[1] == ModifyQp(QpState.RTS)
    assert a.cep.state is S.ESTABLISHED and p.cep.state is S.ESTABLISHED
    dreq = p(SendDreq(dreq_msg(P_ID, A_ID, A_QPN), RTX_MS, 2))[0]
    a(relay(dreq))
    drep = a(SendDrep(drep_msg(A_ID, P_ID)))[0]
    p(relay(drep))
    assert a.cep.state is S.TIMEWAIT and p.cep.state is S.TIMEWAIT
    assert a.fire() == [Release()] and p.fire() == [Release()]


# ---------------------------------------------------------------- the table itself


def test_table_rows_are_unique_and_consistent() -> None:
    keys = [(a, t) for a, t, _, _ in TRANSITIONS]
    assert len(keys) == len(set(keys))
    lap_keys = [(a, t) for a, t, _, _ in LAP_TRANSITIONS]
    assert len(lap_keys) == len(set(lap_keys))
    reached = {b for _, _, b, _ in TRANSITIONS} | {S.IDLE, S.LISTEN}
    assert reached == set(CmState)
    assert {b for _, _, b, _ in LAP_TRANSITIONS} == set(LapState)


def test_every_row_of_the_tables_is_exercised() -> None:
    """Runs every other test of this module and checks each row was taken."""
    SEEN.clear()
    me = sys.modules[__name__]
    for name, fn in inspect.getmembers(me, inspect.isfunction):
        if not name.startswith("test_") or fn is test_every_row_of_the_tables_is_exercised:
            continue
        params = inspect.signature(fn).parameters
        if "stale" in params:
            fn(stale=False)
            fn(stale=True)
        else:
            fn()
    rows = {(a, t, b) for a, t, b, _ in TRANSITIONS} | {(a, t, b) for a, t, b, _ in
                                                        LAP_TRANSITIONS}  # fmt: skip
    missing = rows - SEEN
    assert not missing, "\n".join(f"{a.value} --{t}--> {b.value}" for a, t, b in sorted(
        missing, key=str))  # fmt: skip
    assert rows >= SEEN  # a transition outside the table would be a bug in the machine
