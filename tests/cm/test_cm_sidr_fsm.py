"""ibal.cm.sidr_fsm: SIDR_REQ retransmit and time-out, SIDR_REP matched by request ID."""

from __future__ import annotations

import pytest

from ibal.cm.fsm import (
    Action,
    ArmTimer,
    CancelTimer,
    Deliver,
    Destroy,
    Drop,
    RecvMsg,
    Release,
    TimerFired,
    Transmit,
    UpcallKind,
)
from ibal.cm.sidr_fsm import SIDR_TRANSITIONS, SendSidrRep, SendSidrReq, SidrCep, SidrEvent
from ibal.cm.sidr_fsm import SidrState as D
from ibal.status import InvalidParameter, InvalidState, Status
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, SidrStatus

RID = 0x5A5A0001
SID = 0x0000000001110000 + 4791  # RDMA_PS_UDP service ID (roce-wire.md 3.3)
TIMEOUT_MS = 1 << (20 - 8)  # RDMA CM's SIDR timeout (roce-wire.md 3.5): 4096 ms

SEEN: set[tuple[D, str, D]] = set()


def sidr_req(rid: int = RID) -> bytes:
    return cm.SIDR_REQ.encode(request_id=rid, pkey=0xFFFF, service_id=SID)


def sidr_rep(rid: int = RID, status: SidrStatus = SidrStatus.SUCCESS) -> bytes:
    return cm.SIDR_REP.encode(request_id=rid, status=status, qpn=0x33, service_id=SID,
                              qkey=0x01234567)  # fmt: skip


def as_recv(raw: bytes, attr: CmAttr) -> RecvMsg:
    return RecvMsg(attr, raw, cm.TABLES[attr].decode(raw))


class Drive:
    def __init__(self, cep: SidrCep) -> None:
        self.cep = cep
        self.now = 0.0
        self.timer: ArmTimer | None = None

    def __call__(self, ev: SidrEvent, at: float | None = None) -> list[Action]:
        self.now = self.now if at is None else at
        acts = self.cep.handle(ev, self.now)
        for a in acts:
            if isinstance(a, ArmTimer):
                self.timer = a
        if self.cep.last_transition:
            SEEN.add(self.cep.last_transition)
        return acts

    def fire(self) -> list[Action]:
        t = self.timer
        assert t is not None
        self.timer = None
        return self(TimerFired(t.generation), at=t.at)


def requester(retries: int = 2) -> Drive:
    d = Drive(SidrCep(RID, active=True, now=0.0))
    d(SendSidrReq(sidr_req(), TIMEOUT_MS, retries))
    return d


def test_sidr_req_then_matching_rep() -> None:
    d = Drive(SidrCep(RID, active=True, now=0.0))
    acts = d(SendSidrReq(sidr_req(), TIMEOUT_MS, 2))
    assert acts == [Transmit(CmAttr.SIDR_REQ, sidr_req()), ArmTimer(4.096, d.cep.generation)]
    assert d.cep.state is D.SIDR_REQ_SENT
    other = as_recv(sidr_rep(rid=RID + 1), CmAttr.SIDR_REP)
    assert d(other) == [Drop(f"SIDR_REP for request ID {RID + 1:#x}, this is {RID:#x}")]
    rep = as_recv(sidr_rep(), CmAttr.SIDR_REP)
    acts = d(rep, at=1.0)
    assert acts == [CancelTimer(), Deliver(UpcallKind.SIDR_REP, CmAttr.SIDR_REP, rep.fields,
                                          Status.SUCCESS), Release()]  # fmt: skip
    assert rep.fields["qpn"] == 0x33 and d.cep.state is D.CLOSED
    assert d(rep) == [Drop("unexpected SIDR_REP in closed")]


def test_sidr_req_resent_then_timeout_upcall() -> None:
    d = requester(retries=2)
    for n in (1, 2):
        acts = d.fire()
        assert d.now == pytest.approx(n * 4.096)
        assert acts == [Transmit(CmAttr.SIDR_REQ, sidr_req()),
                        ArmTimer((n + 1) * 4.096, d.cep.generation)]  # fmt: skip
    acts = d.fire()
    assert acts == [Deliver(UpcallKind.SIDR_REP, None, None, Status.TIMEOUT), Release()]
    assert d.cep.state is D.CLOSED
    assert d(TimerFired(d.cep.generation)) == []


def test_sidr_responder() -> None:
    d = Drive(SidrCep(RID, active=False, now=0.0))
    req = as_recv(sidr_req(), CmAttr.SIDR_REQ)
    assert d(req) == [Deliver(UpcallKind.SIDR_REQ, CmAttr.SIDR_REQ, req.fields, Status.SUCCESS)]
    assert d.cep.state is D.SIDR_REQ_RCVD
    assert d(req) == [Drop("unexpected SIDR_REQ in SIDR_REQ rcvd")]
    with pytest.raises(InvalidParameter, match="request ID"):
        d(SendSidrRep(sidr_rep(rid=7)))
    assert d(SendSidrRep(sidr_rep())) == [Transmit(CmAttr.SIDR_REP, sidr_rep()), Release()]
    with pytest.raises(InvalidState, match="closed"):
        d(SendSidrRep(sidr_rep()))


def test_sidr_destroy() -> None:
    for active in (True, False):
        d = Drive(SidrCep(RID, active=active, now=0.0))
        assert d(Destroy()) == [Release()]
    d = requester()
    assert d(Destroy()) == [CancelTimer(), Release()]
    d = Drive(SidrCep(RID, active=False, now=0.0))
    d(as_recv(sidr_req(), CmAttr.SIDR_REQ))
    acts = d(Destroy())
    assert isinstance(acts[0], Transmit) and acts[1:] == [Release()]
    rep = cm.SIDR_REP.decode(acts[0].msg)
    assert (rep["request_id"], rep["status"], rep["service_id"]) == (RID, SidrStatus.REJECT, SID)


def test_sidr_api_checks() -> None:
    d = requester()
    with pytest.raises(InvalidState, match="SIDR_REQ sent"):
        d(SendSidrReq(sidr_req(), TIMEOUT_MS, 2))
    d = Drive(SidrCep(RID, active=True, now=0.0))
    with pytest.raises(InvalidParameter, match="232 bytes"):
        d(SendSidrReq(b"\0" * 8, TIMEOUT_MS, 2))
    with pytest.raises(InvalidState, match="idle"):
        d(SendSidrRep(sidr_rep()))


def test_every_sidr_row_is_exercised() -> None:
    SEEN.clear()
    for fn in (test_sidr_req_then_matching_rep, test_sidr_req_resent_then_timeout_upcall,
               test_sidr_responder, test_sidr_destroy, test_sidr_api_checks):  # fmt: skip
        fn()
    assert {(a, t, b) for a, t, b, _ in SIDR_TRANSITIONS} == SEEN
