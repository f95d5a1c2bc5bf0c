"""The SA transaction machine (ibal.sa.txn) on a stepped clock, and answer decoding."""

from __future__ import annotations

import itertools

import pytest

from ibal.mad.service import transport_message
from ibal.sa.txn import (
    Abandon,
    ArmTimer,
    Finish,
    SaTxn,
    SendTry,
    TxnState,
    decode_answer,
)
from ibal.status import Status
from ibal.wire.fields import FieldError
from ibal.wire.mad import header, sa
from ibal.wire.mad.consts import MadStatus, Method, MgmtClass, SaAttr
from ibal.wire.mad.rmpp import RmppFlags, RmppType, with_rmpp


def node_record(lid: int) -> bytes:
    return sa.NODE_RECORD.encode(lid=lid, node_guid=0x1000 + lid, port_guid=0x2000 + lid)


def answer_to(request: bytes, *, method: int = Method.GET_RESP, status: int = 0,
              records: list[bytes] = (), attr_offset: int = 0) -> bytearray:  # type: ignore[assignment]
    out = bytearray(request[:256])
    out[3] = method
    out[4:6] = status.to_bytes(2, "big")
    out[44:46] = attr_offset.to_bytes(2, "big")
    data = b"".join(records)
    out[56:] = data.ljust(200, b"\0") if len(data) <= 200 else data
    return out


def txn(**kw: object) -> SaTxn:
    tids = itertools.count(0x100)
    args: dict[str, object] = {"method": Method.GET, "attr_id": SaAttr.NODE_RECORD,
                               "data": sa.NODE_RECORD.encode(lid=7),
                               "comp_mask": sa.component_mask(sa.NODE_RECORD, ["lid"]),
                               "timeout_ms": 100, "retry_cnt": 2, "new_tid": lambda: next(tids)}
    args.update(kw)
    return SaTxn(**args)  # type: ignore[arg-type]


def only(actions: list[object], kind: type) -> list[object]:
    return [a for a in actions if isinstance(a, kind)]


def test_the_first_try_is_the_exact_request() -> None:
    t = txn()
    acts = t.start(10.0)
    [send] = only(acts, SendTry)
    assert isinstance(send, SendTry) and send.tid == 0x100 and send.attempt == 1
    assert ArmTimer(10.1) in acts
    h = header.header(send.mad)
    assert (h.mgmt_class, h.class_version, h.method, h.attr_id, h.tid) == (
        MgmtClass.SUBN_ADM, 2, Method.GET, SaAttr.NODE_RECORD, 0x100)
    assert header.SA_HEADER.decode(send.mad[36:56])["comp_mask"] == 1
    assert sa.NODE_RECORD.decode(send.mad[56:56 + sa.NODE_RECORD.size])["lid"] == 7
    assert t.state is TxnState.WAITING


def test_tries_each_with_a_new_tid_then_timeout() -> None:
    t = txn()
    acts = t.start(0.0)
    assert t.on_timer(0.05) == [ArmTimer(0.1)]  # early (a re-armed timer): wait on
    tids = [0x100]
    for n in (2, 3):
        [arm] = only(acts, ArmTimer)
        assert isinstance(arm, ArmTimer) and arm.at == pytest.approx(0.1 * (n - 1))
        acts = t.on_timer(arm.at)
        assert acts[0] == Abandon(tids[-1])
        [send] = only(acts, SendTry)
        assert isinstance(send, SendTry) and send.attempt == n and send.tid not in tids
        tids.append(send.tid)
    assert not t.done
    [arm] = only(acts, ArmTimer)
    assert isinstance(arm, ArmTimer) and arm.at is not None
    acts = t.on_timer(arm.at)
    assert acts[0] == Abandon(tids[-1]) and ArmTimer(None) in acts
    [fin] = only(acts, Finish)
    assert isinstance(fin, Finish) and fin.answer.status is Status.TIMEOUT
    assert t.done and t.attempts == 3 and t.on_timer(9.0) == []


def test_an_answer_to_a_given_up_try_is_stale() -> None:
    t = txn()
    first = only(t.start(0.0), SendTry)[0]
    second = only(t.on_timer(0.1), SendTry)[0]
    assert isinstance(first, SendTry) and isinstance(second, SendTry)
    assert t.on_response(answer_to(first.mad, records=[node_record(7)])) == []
    assert t.stale == 1 and not t.done
    acts = t.on_response(answer_to(second.mad, records=[node_record(7)], attr_offset=14))
    [fin] = only(acts, Finish)
    assert isinstance(fin, Finish) and fin.answer.ok
    assert not only(acts, Abandon)  # answered: nothing to stop
    assert sa.NODE_RECORD.decode(fin.answer.records[0][:108])["node_guid"] == 0x1007


def test_cancel_ends_once_with_canceled() -> None:
    t = txn()
    send = only(t.start(0.0), SendTry)[0]
    acts = t.cancel()
    assert acts[0] == Abandon(0x100)
    [fin] = only(acts, Finish)
    assert isinstance(fin, Finish) and fin.answer.status is Status.CANCELED
    assert t.cancel() == [] and t.on_timer(1.0) == []
    assert isinstance(send, SendTry) and t.on_response(answer_to(send.mad)) == []


def test_a_send_failure_fails_the_request() -> None:
    t = txn()
    t.start(0.0)
    assert t.on_send_failed(0x999, "other") == []
    [fin] = only(t.on_send_failed(0x100, "no route"), Finish)
    assert isinstance(fin, Finish) and fin.answer.status is Status.ERROR
    assert "no route" in fin.answer.detail


def test_bad_settings_are_refused_at_once() -> None:
    with pytest.raises(ValueError):
        txn(timeout_ms=0)
    with pytest.raises(ValueError):
        txn(retry_cnt=-1)
    with pytest.raises(FieldError):
        txn(comp_mask=1 << 64)
    with pytest.raises(FieldError):
        txn(data=bytes(201))


def test_decode_get_resp_error_status_and_table() -> None:
    req = bytes(only(txn().start(0.0), SendTry)[0].mad)  # type: ignore[union-attr]
    a = decode_answer(answer_to(req, records=[node_record(3)], attr_offset=14))
    assert a.ok and a.method == Method.GET_RESP and len(a.records) == 1
    assert len(a.records[0]) == 112
    # A GetResp without AttributeOffset: the whole data area is the record.
    a = decode_answer(answer_to(req, records=[node_record(3)]))
    assert a.ok and len(a.records) == 1 and len(a.records[0]) == 200
    a = decode_answer(answer_to(req, status=MadStatus.SA_NO_RECORDS))
    assert (a.status, a.mad_status, a.records) == (Status.REMOTE_ERROR, 0x0300, ())
    recs = [node_record(i) for i in range(1, 6)]
    msg = answer_to(req, method=Method.GET_TABLE_RESP, attr_offset=14,
                    records=[r.ljust(112, b"\0") for r in recs])
    a = decode_answer(msg)
    assert a.ok and len(a.records) == 5
    assert [sa.NODE_RECORD.decode(r[:108])["lid"] for r in a.records] == [1, 2, 3, 4, 5]
    empty = answer_to(req, method=Method.GET_TABLE_RESP, attr_offset=14)[:56]
    assert decode_answer(empty).records == ()


def first_segment(req: bytes, segments: int) -> bytes:
    """The first of ``segments`` RMPP segments of a GetTableResp, as ibsim delivers it."""
    msg = answer_to(req, method=Method.GET_TABLE_RESP, attr_offset=14,
                    records=[node_record(i).ljust(112, b"\0") for i in range(1, 2)])
    flags = RmppFlags.ACTIVE | RmppFlags.FIRST | (RmppFlags.LAST if segments == 1 else 0)
    return with_rmpp(bytes(msg), version=1, type=RmppType.DATA, resp_time=0x1F, flags=flags,
                     status=0, segment_number=1,
                     payload_length=segments * 220 - 40 if segments > 1 else 20 + 112)


def test_a_cut_rmpp_answer_is_an_error_not_a_short_list() -> None:
    req = bytes(only(txn().start(0.0), SendTry)[0].mad)  # type: ignore[union-attr]
    cut = first_segment(req, 3)
    assert transport_message(cut) is None  # the service delivers it as it came
    a = decode_answer(cut)
    assert a.status is Status.ERROR and a.records == ()
    assert "cut short" in a.detail and "PayloadLength 620" in a.detail
    # One segment with Last: whole; its PayloadLength gives the exact length.
    whole = transport_message(first_segment(req, 1))
    assert whole is not None and len(whole) == 56 + 112 and whole[24:36] == bytes(12)
    a = decode_answer(whole)
    assert a.ok and len(a.records) == 1
    # Reassembled by a kernel: longer than a MAD, whole as it is.
    long = bytearray(first_segment(req, 3)) + bytes(112 * 3)
    whole = transport_message(bytes(long))
    assert whole is not None and len(whole) == len(long) and whole[24:36] == bytes(12)
