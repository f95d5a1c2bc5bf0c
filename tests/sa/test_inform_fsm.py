"""The InformInfo subscription machine (sans-IO): records, ordering, renewals, unsubscribe."""

from __future__ import annotations

import pytest

from ibal.sa.inform_fsm import (
    ArmTimer,
    CancelRequest,
    Deliver,
    Finish,
    InformInfo,
    InformMachine,
    Notice,
    SubDone,
    SubPhase,
    TransmitSet,
)
from ibal.status import Status
from ibal.wire.fields import FieldError
from ibal.wire.mad import sa

GID_A = bytes.fromhex("fe800000000000000000000000100005")
SM_GID = bytes.fromhex("fe800000000000000000000000100001")


def notice(trap: int, *, lid: int = 1, gid: bytes = SM_GID, subject: bytes = GID_A,
           ntype: int = 4, producer: int = 4) -> Notice:  # fmt: skip
    details = {64: sa.TRAP_64_65_DETAILS, 65: sa.TRAP_64_65_DETAILS, 128: sa.TRAP_128_DETAILS}
    if trap in (64, 65):
        dd = details[trap].encode(gid=subject)
    elif trap == 128:
        dd = details[trap].encode(lid=lid)
    else:
        dd = bytes(54)
    raw = sa.NOTICE.encode(is_generic=1, type=ntype, producer_type=producer, trap_number=trap,
                           issuer_lid=lid, data_details=dd, issuer_gid=gid)  # fmt: skip
    return Notice.decode(raw)


def started(info: InformInfo | None = None) -> tuple[InformMachine, TransmitSet]:
    m = InformMachine(info or InformInfo(trap_number=64))
    acts = m.subscribe()
    assert len(acts) == 1 and isinstance(acts[0], TransmitSet)
    return m, acts[0]


def active(info: InformInfo | None = None) -> InformMachine:
    m, s = started(info)
    assert m.answer(s.tag, Status.SUCCESS, 0, (s.record,)) == [SubDone(Status.SUCCESS)]
    return m


def test_the_set_carries_the_informinfo_with_subscribe_1_then_0() -> None:
    info = InformInfo(trap_number=128, trap_type=1, producer_type=2)
    m, s = started(info)
    d = sa.INFORM_INFO.decode(s.record)
    assert (d["subscribe"], d["is_generic"], d["trap_number"], d["type"]) == (1, 1, 128, 1)
    assert (d["producer_type"], d["lid_range_begin"], d["qpn"], d["resp_time_value"]) == (
        2, 0xFFFF, 1, 18)  # fmt: skip
    m.answer(s.tag, Status.SUCCESS)
    (u,) = m.unsubscribe()
    assert isinstance(u, TransmitSet) and not u.subscribe
    assert sa.INFORM_INFO.decode(u.record)["subscribe"] == 0
    assert u.record[:23] + u.record[24:] == s.record[:23] + s.record[24:]  # only Subscribe
    assert m.answer(u.tag, Status.SUCCESS) == [Finish(Status.SUCCESS)]
    assert m.phase is SubPhase.GONE


def test_a_report_before_the_answer_waits_for_the_sub_callback() -> None:
    m, s = started()
    assert m.report(notice(64)) == []  # held: the sub callback comes first
    acts = m.answer(s.tag, Status.SUCCESS)
    assert acts == [SubDone(Status.SUCCESS), Deliver(notice(64))]
    assert m.report(notice(64)) == [Deliver(notice(64))]


def test_a_failed_subscribe_drops_held_reports_and_delivers_none_later() -> None:
    m, s = started()
    m.report(notice(64))
    assert m.answer(s.tag, Status.REMOTE_ERROR, 0x0200) == [SubDone(Status.REMOTE_ERROR, 0x0200)]
    assert m.phase is SubPhase.FAILED
    assert m.report(notice(64)) == []
    assert m.dropped_reports == 2
    assert m.unsubscribe() == [Finish(Status.SUCCESS)]  # nothing to undo at the SA


def test_timeout_is_the_outcome_when_no_sa_answers() -> None:
    m, s = started()
    assert m.answer(s.tag, Status.TIMEOUT) == [SubDone(Status.TIMEOUT)]


def test_stale_answers_are_ignored() -> None:
    m, s = started()
    assert m.answer(s.tag + 7, Status.SUCCESS) == []
    assert m.phase is SubPhase.SUBSCRIBING


def test_an_echo_cut_to_opensms_attribute_offset_is_ours() -> None:
    m, s = started()  # OpenSM's AttributeOffset 4: 32 of the 36 bytes
    assert m.answer(s.tag, Status.SUCCESS, 0, (s.record[:32],)) == [SubDone(Status.SUCCESS)]


def test_an_echo_that_is_not_our_record_fails_the_subscribe() -> None:
    m, s = started()
    other = InformInfo(trap_number=65).encode(True)
    assert m.answer(s.tag, Status.SUCCESS, 0, (other,)) == [SubDone(Status.ERROR)]


def test_no_report_after_unsubscribe() -> None:
    m = active()
    (u,) = m.unsubscribe()
    assert m.report(notice(64)) == []
    assert m.answer(u.tag, Status.TIMEOUT) == [Finish(Status.TIMEOUT)]
    assert m.report(notice(64)) == []
    assert m.dropped_reports == 2


def test_unsubscribe_before_the_answer_undoes_a_subscribe_the_sa_took() -> None:
    m, s = started()
    assert m.unsubscribe() == []  # the Set may still be taken: wait for its answer
    (u,) = m.answer(s.tag, Status.SUCCESS)
    assert isinstance(u, TransmitSet) and not u.subscribe  # no SubDone, no report
    assert m.answer(u.tag, Status.SUCCESS) == [Finish(Status.SUCCESS)]


def test_unsubscribe_before_a_failed_answer_ends_at_once() -> None:
    m, s = started()
    m.unsubscribe()
    assert m.answer(s.tag, Status.TIMEOUT) == [Finish(Status.SUCCESS)]


def test_reregister_renews_and_a_refused_renewal_backs_off() -> None:
    m = active()
    (r,) = m.reregister()
    assert isinstance(r, TransmitSet) and r.subscribe
    assert m.reregister() == []  # one Set at a time: the second one follows
    (r2,) = m.answer(r.tag, Status.SUCCESS)
    assert isinstance(r2, TransmitSet) and r2.subscribe and m.renewals == 1
    assert m.answer(r2.tag, Status.TIMEOUT) == [ArmTimer(1.0)]
    assert m.phase is SubPhase.ACTIVE and m.last_renew_status is Status.TIMEOUT
    (r3,) = m.retry_due()
    assert m.answer(r3.tag, Status.REMOTE_ERROR, 0x0100) == [ArmTimer(2.0)]
    (r4,) = m.retry_due()
    assert m.answer(r4.tag, Status.SUCCESS) == [] and m.renewals == 2
    assert m.report(notice(64)) == [Deliver(notice(64))]  # still delivering throughout


def test_reregister_during_the_first_set_renews_after_it() -> None:
    m, s = started()
    assert m.reregister() == []
    acts = m.answer(s.tag, Status.SUCCESS)
    assert acts[0] == SubDone(Status.SUCCESS)
    assert isinstance(acts[1], TransmitSet) and acts[1].subscribe


def test_unsubscribe_during_a_renewal_follows_it() -> None:
    m = active()
    (r,) = m.reregister()
    assert m.unsubscribe() == []
    (u,) = m.answer(r.tag, Status.SUCCESS)
    assert isinstance(u, TransmitSet) and not u.subscribe
    assert m.retry_due() == []


@pytest.mark.parametrize(
    ("info", "hits"),
    [
        (InformInfo(trap_number=64), {64}),
        (InformInfo(), {64, 65, 128}),
        (InformInfo(trap_number=128, producer_type=2), set()),  # our 128 comes from a CA here
        (InformInfo(trap_type=4), {64, 65}),
        (InformInfo(gid=SM_GID), {64, 65, 128}),
        (InformInfo(gid=GID_A), set()),  # the GID selects the issuer, not the subject
        (InformInfo(lid_range_begin=1), {64, 65, 128}),
        (InformInfo(lid_range_begin=2, lid_range_end=9), set()),
        (InformInfo(is_generic=False), set()),
    ],
)
def test_reports_match_as_the_sa_filters_them(info: InformInfo, hits: set[int]) -> None:
    got = {t for t in (64, 65, 128)
           if info.matches(notice(t, ntype=1 if t == 128 else 4))}  # fmt: skip
    assert got == hits


def test_notice_decodes_trap_details() -> None:
    n = notice(65)
    assert (n.trap_number, n.issuer_lid, n.issuer_gid, n.details) == (65, 1, SM_GID,
                                                                      {"gid": GID_A})
    assert notice(128, lid=2).details == {"lid": 2}
    with pytest.raises(FieldError):
        Notice.decode(bytes(40))


def test_informinfo_round_trip_and_range_checks() -> None:
    info = InformInfo(trap_number=144, gid=GID_A, qpn=0x123456, resp_time_value=5)
    assert InformInfo.decode(info.encode(True)) == info
    with pytest.raises(FieldError):
        InformInfo(trap_number=0x10000)
    with pytest.raises(FieldError):
        InformInfo(gid=b"short")


def test_unsubscribe_of_a_shared_record_sends_nothing() -> None:
    m = active()
    assert m.unsubscribe(shared=True) == [Finish(Status.SUCCESS)]
    m2, s = started()
    assert m2.unsubscribe(shared=True) == [CancelRequest(s.tag), Finish(Status.SUCCESS)]
    assert m2.answer(s.tag, Status.SUCCESS) == []
