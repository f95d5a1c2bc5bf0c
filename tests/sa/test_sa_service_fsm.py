"""The service registration machine (ibal.sa.service_fsm), driven with numbers: no I/O, no clock."""

from __future__ import annotations

from ibal.sa.service_fsm import (
    INFINITE_LEASE,
    MIN_RETRY,
    ArmTimer,
    Attempt,
    CancelRequest,
    Deliver,
    Finish,
    Phase,
    ServiceLease,
    Transmit,
)
from ibal.status import Status
from ibal.wire.mad.consts import Method
from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

NAMES = ["service_id", "service_gid", "service_p_key", "service_lease", "service_name"]
MASK = component_mask(SERVICE_RECORD, NAMES)
SA_NO_RECORDS = 0x0300


def rec(lease: int, *, data8: int = 0) -> bytes:
    return SERVICE_RECORD.encode(
        service_id=0x10, service_gid=bytes(range(16)), service_p_key=0xFFFF,
        service_lease=lease, service_name=b"svc".ljust(64, b"\0"), service_data8_0=data8,
    )  # fmt: skip


def sends(actions: list[object]) -> list[Transmit]:
    return [a for a in actions if isinstance(a, Transmit)]


def only(actions: list[object], kind: type) -> object:
    got = [a for a in actions if isinstance(a, kind)]
    assert len(got) == 1, actions
    return got[0]


def test_register_then_renew_at_half_lease_from_the_send_time() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(100.0))
    assert (s.method, s.comp_mask, s.record) == (Method.SET, MASK, rec(60))
    out = m.answer(s.token, Status.SUCCESS, 0, rec(60, data8=9), 100.4)
    assert only(out, ArmTimer) == ArmTimer(130.0)  # sent at 100, lease 60: renew at 130
    r = only(out, Deliver)
    assert isinstance(r, Deliver)
    assert (r.attempt, r.status, r.record) == (Attempt.REGISTER, Status.SUCCESS, rec(60, data8=9))
    assert (m.phase, m.expires) == (Phase.ACTIVE, 160.0)
    assert m.timer(129.9) == []  # early (a rescheduled timer's stale firing)
    (s2,) = sends(m.timer(130.0))
    assert (s2.method, s2.record) == (Method.SET, rec(60))  # our record, not the answered one
    out = m.answer(s2.token, Status.SUCCESS, 0, rec(60), 130.2)
    assert only(out, ArmTimer) == ArmTimer(160.0)
    assert not [a for a in out if isinstance(a, Deliver)]  # a renewal that worked is quiet


def test_infinite_lease_or_no_lease_bit_never_renews() -> None:
    for lease, mask in ((INFINITE_LEASE, MASK), (30, MASK & ~component_mask(SERVICE_RECORD,
                                                                           ["service_lease"]))):
        m = ServiceLease(rec(lease), mask)
        (s,) = sends(m.start(0.0))
        out = m.answer(s.token, Status.SUCCESS, 0, rec(INFINITE_LEASE), 0.1)
        assert not [a for a in out if isinstance(a, ArmTimer) and a.at is not None], out
        assert m.expires is None and m.timer(1e9) == []


def test_renew_false_lets_the_lease_run_out() -> None:
    m = ServiceLease(rec(60), MASK, renew=False)
    (s,) = sends(m.start(0.0))
    out = m.answer(s.token, Status.SUCCESS, 0, rec(60), 0.1)
    assert not [a for a in out if isinstance(a, ArmTimer) and a.at is not None]
    assert m.expires == 60.0 and m.timer(30.0) == []


def test_first_set_failing_reports_and_finishes_without_a_delete() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    out = m.answer(s.token, Status.REMOTE_ERROR, 0x0200, None, 0.2)
    r = only(out, Deliver)
    assert isinstance(r, Deliver)
    assert (r.status, r.mad_status, r.attempt) == (Status.REMOTE_ERROR, 0x0200, Attempt.REGISTER)
    assert only(out, Finish) == Finish(None, False)
    assert not sends(out) and m.phase is Phase.DONE
    assert m.stop(1.0) == []


def test_failed_renewal_is_reported_retried_before_the_lease_ends_and_recovery_reported() -> None:
    m = ServiceLease(rec(20), MASK)
    (s,) = sends(m.start(0.0))
    m.answer(s.token, Status.SUCCESS, 0, rec(20), 0.1)  # expires 20, renew at 10
    (s,) = sends(m.timer(10.0))
    out = m.answer(s.token, Status.TIMEOUT, 0, None, 14.0)  # the SA did not answer in 4 s
    r = only(out, Deliver)
    assert isinstance(r, Deliver) and (r.attempt, r.status) == (Attempt.RENEW, Status.TIMEOUT)
    assert only(out, ArmTimer) == ArmTimer(17.0)  # halfway from 14 to the end at 20
    (s,) = sends(m.timer(17.0))
    out = m.answer(s.token, Status.TIMEOUT, 0, None, 19.5)
    assert only(out, ArmTimer) == ArmTimer(19.5 + MIN_RETRY)  # never closer than MIN_RETRY
    (s,) = sends(m.timer(20.5))
    out = m.answer(s.token, Status.TIMEOUT, 0, None, 24.5)
    assert only(out, ArmTimer) == ArmTimer(34.5)  # lapsed: retry at the renewal cadence (lease/2)
    (s,) = sends(m.timer(34.5))
    out = m.answer(s.token, Status.SUCCESS, 0, rec(20), 34.6)
    r = only(out, Deliver)
    assert isinstance(r, Deliver) and (r.attempt, r.status) == (Attempt.RENEW, Status.SUCCESS)
    assert only(out, ArmTimer) == ArmTimer(44.5) and m.expires == 54.5


def test_reregister_sets_at_once_and_after_a_set_in_flight() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    m.answer(s.token, Status.SUCCESS, 0, rec(60), 0.1)
    out = m.reregister(5.0)
    (s,) = sends(out)
    assert ArmTimer(None) in out and s.method is Method.SET
    assert m.reregister(5.1) == []  # in flight: remembered
    out = m.answer(s.token, Status.SUCCESS, 0, rec(60), 5.2)
    (s2,) = sends(out)  # the second Set, for the event that came during the first
    assert s2.token != s.token
    out = m.answer(s2.token, Status.SUCCESS, 0, rec(60), 5.3)
    assert only(out, ArmTimer) == ArmTimer(35.2) and not sends(out)


def test_stop_while_registering_cancels_reports_canceled_and_deletes() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    out = m.stop(0.5)
    assert only(out, CancelRequest) == CancelRequest(s.token)
    r = only(out, Deliver)
    assert isinstance(r, Deliver) and r.status is Status.CANCELED
    (d,) = sends(out)
    assert (d.method, d.record, d.comp_mask) == (Method.DELETE, rec(60), MASK)
    assert m.answer(s.token, Status.CANCELED, 0, None, 0.6) == []  # the cancelled Set: stale
    out = m.answer(d.token, Status.REMOTE_ERROR, SA_NO_RECORDS, None, 0.7)
    assert out == [Finish(Status.REMOTE_ERROR, False, SA_NO_RECORDS)]


def test_stop_when_active_disarms_and_deletes_once() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    m.answer(s.token, Status.SUCCESS, 0, rec(60), 0.1)
    out = m.stop(3.0)
    assert ArmTimer(None) in out and not [a for a in out if isinstance(a, Deliver | CancelRequest)]
    (d,) = sends(out)
    assert d.method is Method.DELETE
    assert m.stop(3.1) == [] and m.timer(30.0) == [] and m.reregister(3.2) == []
    assert m.answer(d.token, Status.SUCCESS, 0, rec(60), 3.3) == [Finish(Status.SUCCESS, True)]


def test_stop_during_a_renewal_cancels_it_quietly() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    m.answer(s.token, Status.SUCCESS, 0, rec(60), 0.1)
    (r,) = sends(m.timer(30.0))
    out = m.stop(30.1)
    assert only(out, CancelRequest) == CancelRequest(r.token)
    assert not [a for a in out if isinstance(a, Deliver)]
    assert sends(out)[0].method is Method.DELETE


def test_stop_before_start_finishes_at_once() -> None:
    m = ServiceLease(rec(60), MASK)
    assert m.stop(0.0) == [Finish(None, False)]
    assert m.start(0.0) == []


def test_reregister_during_the_first_set_sets_again_after_it() -> None:
    m = ServiceLease(rec(60), MASK)
    (s,) = sends(m.start(0.0))
    assert m.reregister(0.1) == []  # the answer may come from the SM that forgets
    out = m.answer(s.token, Status.SUCCESS, 0, rec(60), 0.2)
    r = only(out, Deliver)
    assert isinstance(r, Deliver) and r.attempt is Attempt.REGISTER
    (s2,) = sends(out)
    assert s2.method is Method.SET
    out = m.answer(s2.token, Status.SUCCESS, 0, rec(60), 0.3)
    assert not [a for a in out if isinstance(a, Deliver)] and only(out, ArmTimer) == ArmTimer(30.2)
