"""The multicast membership machine, input by input (no I/O, no clock)."""

from __future__ import annotations

import pytest

from ibal.sa.mcast_fsm import (
    LEAVE_MASK,
    ArmTimer,
    Attach,
    CancelRequest,
    Deliver,
    Detach,
    Finish,
    JoinState,
    McastMachine,
    McastPhase,
    MemberRec,
    TransmitDelete,
    TransmitSet,
    join_mask,
)
from ibal.status import Status
from ibal.types import Gid
from ibal.wire.mad.sa import MCMEMBER_RECORD, component_bits

MGID = Gid("ff12:401b:ffff::1")
PORT_GID = Gid("fe80::2:c903:0:1")
SA_REMOTE_ERR_REQ_INVALID = 0x0200


def answer_rec(req: bytes, mlid: int, mgid: Gid = MGID) -> bytes:
    """What an SA answers a join with: the request completed (padded to 56 bytes)."""
    rec = MemberRec.decode(req)
    out = MemberRec(**{**{f: getattr(rec, f) for f in rec.__slots__}, "mlid": mlid, "mgid": mgid})
    return out.encode() + bytes(4)


def machine(join_state: JoinState = JoinState.FULL, mgid: Gid = MGID) -> McastMachine:
    req = MemberRec(mgid=mgid, port_gid=PORT_GID, join_state=join_state)
    return McastMachine(req, join_mask((), create=False), first_backoff=1.0, max_backoff=4.0)


def test_record_round_trip_and_masks() -> None:
    rec = MemberRec(mgid=MGID, port_gid=PORT_GID, q_key=0x80010000, mlid=0xC001, mtu=4,
                    tclass=3, p_key=0xFFFF, rate=3, sl=5, flow_label=0x12345, hop_limit=7,
                    scope=2, join_state=JoinState.SENDONLY)  # fmt: skip
    data = rec.encode()
    assert len(data) == MCMEMBER_RECORD.size == 52
    assert data[:16] == MGID.packed and data[16:32] == PORT_GID.packed
    assert data[32:36] == bytes.fromhex("80010000") and data[36:38] == b"\xc0\x01"
    assert data[48] == 0x24  # scope 2, join state SendOnlyNonMember (bit 2)
    assert MemberRec.decode(data + bytes(4)) == rec
    bits = component_bits(MCMEMBER_RECORD)
    assert (1 << bits["mgid"]) | (1 << bits["port_gid"]) | (1 << bits["join_state"]) == LEAVE_MASK
    assert LEAVE_MASK == 0x10003  # IBA: MGID bit 0, PortGID bit 1, JoinState bit 16
    create = join_mask(("mtu",), create=True)
    for name in ("q_key", "tclass", "p_key", "flow_label", "sl", "mtu"):
        assert create & (1 << bits[name])
    assert not create & (1 << bits["mlid"])


def test_join_attach_report_then_leave_detach_delete() -> None:
    m = machine(JoinState.NON)
    (send,) = m.join()
    assert isinstance(send, TransmitSet) and send.comp_mask == LEAVE_MASK
    assert MemberRec.decode(send.record).join_state is JoinState.NON
    assert m.phase is McastPhase.JOINING
    acts = m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC005)])
    assert acts[0] == Attach(MGID, 0xC005)
    assert isinstance(acts[1], Deliver) and acts[1].status is Status.SUCCESS
    assert acts[1].record is not None and acts[1].record.mlid == 0xC005 and not acts[1].rejoin
    assert m.phase is McastPhase.JOINED
    acts = m.leave()
    assert acts[0] == Detach()
    delete = acts[1]
    assert isinstance(delete, TransmitDelete) and delete.comp_mask == LEAVE_MASK
    left = MemberRec.decode(delete.record)
    assert (left.mgid, left.port_gid, left.join_state) == (MGID, PORT_GID, JoinState.NON)
    assert m.phase is McastPhase.LEAVING and m.leave() == []
    assert m.answer(delete.tag, Status.SUCCESS) == [Finish(Status.SUCCESS)]
    assert m.phase is McastPhase.LEFT


def test_first_join_error_reports_and_ends() -> None:
    m = machine()
    (send,) = m.join()
    acts = m.answer(send.tag, Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID)
    assert acts == [
        Deliver(Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID),
        Finish(Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID),
    ]
    assert m.phase is McastPhase.LEFT and m.attached is None
    assert m.reregister() == [] and m.leave() == []


def test_success_without_a_record_is_an_error() -> None:
    m = machine()
    (send,) = m.join()
    assert m.answer(send.tag, Status.SUCCESS, 0, [b"short"])[0] == Deliver(Status.ERROR)


def test_stale_answers_are_ignored() -> None:
    m = machine()
    (first,) = m.join()
    cancel, second = m.reregister()  # e.g. SM change while the first join was out
    assert cancel == CancelRequest(first.tag) and isinstance(second, TransmitSet)
    assert m.answer(first.tag, Status.SUCCESS, 0, [answer_rec(first.record, 0xC001)]) == []
    assert m.answer(first.tag, Status.CANCELED) == []
    acts = m.answer(second.tag, Status.SUCCESS, 0, [answer_rec(second.record, 0xC002)])
    assert acts[0] == Attach(MGID, 0xC002)


def test_rejoin_keeps_attachment_or_moves_it_and_says_rejoin() -> None:
    m = machine()
    (send,) = m.join()
    m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC001)])
    (again,) = m.reregister()
    assert isinstance(again, TransmitSet) and m.phase is McastPhase.JOINING
    assert m.attached == (MGID, 0xC001)  # traffic keeps flowing meanwhile
    acts = m.answer(again.tag, Status.SUCCESS, 0, [answer_rec(again.record, 0xC001)])
    assert acts == [Deliver(Status.SUCCESS, 0, m.record, True)]  # same MLID: no re-attach
    (again,) = m.reregister()
    acts = m.answer(again.tag, Status.SUCCESS, 0, [answer_rec(again.record, 0xC007)])
    assert acts[:2] == [Detach(), Attach(MGID, 0xC007)] and m.attached == (MGID, 0xC007)


def test_rejoin_failure_retries_with_doubling_backoff() -> None:
    m = machine()
    (send,) = m.join()
    m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC001)])
    (send,) = m.reregister()
    delays = []
    for _ in range(4):
        report, arm = m.answer(send.tag, Status.TIMEOUT)
        assert report == Deliver(Status.TIMEOUT, 0, None, True)
        assert isinstance(arm, ArmTimer)
        delays.append(arm.delay)
        assert m.phase is McastPhase.JOINING and m.attached == (MGID, 0xC001)
        (send,) = m.retry_due()
        assert isinstance(send, TransmitSet)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC001)])[-1].rejoin
    (send,) = m.reregister()
    assert m.answer(send.tag, Status.TIMEOUT)[1] == ArmTimer(1.0)  # success reset it
    assert m.retry_due() != [] and m.retry_due() == []  # one retry per ArmTimer


def test_leave_while_rejoin_waits_stops_retrying() -> None:
    m = machine()
    (send,) = m.join()
    m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC001)])
    (send,) = m.reregister()
    m.answer(send.tag, Status.TIMEOUT)
    acts = m.leave()
    assert acts[0] == Detach() and isinstance(acts[1], TransmitDelete)
    assert m.retry_due() == [] and m.reregister() == []
    assert m.answer(acts[1].tag, Status.TIMEOUT) == [Finish(Status.TIMEOUT)]


def test_leave_before_the_join_answered_cancels_and_still_deletes() -> None:
    m = machine()
    (send,) = m.join()
    cancel, report, delete = m.leave()
    assert cancel == CancelRequest(send.tag) and report == Deliver(Status.CANCELED)
    assert isinstance(delete, TransmitDelete)
    assert m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC001)]) == []
    assert m.answer(delete.tag, Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID) == [
        Finish(Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID)
    ]


def test_sa_assigned_mgid_is_the_one_rejoined_and_left() -> None:
    zero = Gid(0)
    req = MemberRec(mgid=zero, port_gid=PORT_GID, q_key=0x11, p_key=0xFFFF)
    m = McastMachine(req, join_mask((), create=True))
    (send,) = m.join()
    assert MemberRec.decode(send.record).mgid == zero
    assigned = Gid("ff12:a01b:ffff::c0:ffee")
    acts = m.answer(send.tag, Status.SUCCESS, 0, [answer_rec(send.record, 0xC003, assigned)])
    assert acts[0] == Attach(assigned, 0xC003)
    (again,) = m.reregister()
    assert MemberRec.decode(again.record).mgid == assigned
    # a plain join of that group: OpenSM refuses to *create* a group with its own
    # MGID signature (ERR 1B24), so only a group that is gone gets a new MGID
    assert again.comp_mask == join_mask((), create=False)
    m.answer(again.tag, Status.SUCCESS, 0, [answer_rec(again.record, 0xC003, assigned)])
    assert m.attached == (assigned, 0xC003)
    (again,) = m.reregister()
    report, anew = m.answer(again.tag, Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID)
    assert report == Deliver(Status.REMOTE_ERROR, SA_REMOTE_ERR_REQ_INVALID, None, True)
    assert isinstance(anew, TransmitSet) and anew.comp_mask == send.comp_mask
    assert MemberRec.decode(anew.record).mgid == zero
    other = Gid("ff12:a01b:ffff::c0:fff0")
    acts = m.answer(anew.tag, Status.SUCCESS, 0, [answer_rec(anew.record, 0xC004, other)])
    assert acts[:2] == [Detach(), Attach(other, 0xC004)]
    (again,) = m.reregister()
    assert MemberRec.decode(again.record).mgid == other  # that one from now on
    m.answer(again.tag, Status.SUCCESS, 0, [answer_rec(again.record, 0xC004, other)])
    delete = m.leave()[1]
    assert isinstance(delete, TransmitDelete) and MemberRec.decode(delete.record).mgid == other


def test_bad_join_state_is_refused() -> None:
    with pytest.raises(ValueError):
        McastMachine(MemberRec(join_state=JoinState(0)), 0)
    with pytest.raises(RuntimeError):
        m = machine()
        m.join()
        m.join()
