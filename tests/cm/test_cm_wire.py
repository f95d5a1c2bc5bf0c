"""ibal.cm.wire: CM messages built from records, checked byte by byte and decoded back.

The byte offsets asserted here are the ones of roce-wire.md 3.2 (Linux
``ibta_vol1_c12.h``; IBA vol. 1 12.6 for LAP/APR/MRA), read with ``struct``
straight from the 232-byte data area, independent of ``ibal.wire.mad.cm``'s tables.
"""

from __future__ import annotations

import struct
from ipaddress import IPv6Address
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.cm import records as R
from ibal.cm import wire as W
from ibal.sa.query import Record
from ibal.status import InvalidParameter, InvalidSetting
from ibal.types import QpType
from ibal.wire.mad import cm
from ibal.wire.mad import header as H
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason
from ibal.wire.mad.sa import PATH_RECORD

QP = object()
GID_A = IPv6Address("::ffff:10.1.16.61")
GID_B = IPv6Address("::ffff:10.1.16.62")


def _cb(*_: Any) -> None:
    return None


def roce_path(**kw: Any) -> dict[str, Any]:
    """A RoCE PathRecord as ibal.sa.roce answers (hop limit from the route, life 16)."""
    p = {"sgid": GID_A, "dgid": GID_B, "slid": 0, "dlid": 0, "flow_label": 0,
         "hop_limit": 64, "tclass": 0, "p_key": 0xFFFF, "sl": 0, "mtu": 3, "rate": 16,
         "packet_life_time": 16}  # fmt: skip
    return {**p, **kw}


def ib_path(**kw: Any) -> dict[str, Any]:
    p = {"sgid": IPv6Address("fe80::2:c903:1"), "dgid": IPv6Address("fe80::2:c903:2"),
         "slid": 0x11, "dlid": 0x22, "flow_label": 0x12345, "hop_limit": 0, "tclass": 0x5A,
         "p_key": 0x8123, "sl": 9, "mtu": 4, "rate": 6, "packet_life_time": 14}  # fmt: skip
    return {**p, **kw}


def u24(b: bytes, at: int) -> int:
    return int.from_bytes(b[at : at + 3], "big")


def u32(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">I", b, at)[0])


def u16(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">H", b, at)[0])


def u64(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">Q", b, at)[0])


def make_req(**kw: Any) -> R.CmReq:
    base: dict[str, Any] = {
        "svc_id": 0x0000_0000_0106_1C06, "primary_path": ib_path(), "qp": QP, "rep_cb": _cb,
        "max_cm_retries": 11, "pdata": b"\x00\x40\x1c\x06hello", "resp_res": 0xA5,
        "init_depth": 0x3C, "remote_resp_timeout": 21, "flow_ctrl": True,
        "local_resp_timeout": 19, "rnr_retry_cnt": 5, "retry_cnt": 6,
    }  # fmt: skip
    return R.CmReq(**{**base, **kw})


REQ_FACTS: dict[str, Any] = {"local_comm_id": 0x6EC0C56D, "local_ca_guid": 0x0002_C903_00AB_CDEF,
                             "local_qpn": 0xABCDEF, "starting_psn": 0x123456,
                             "ca_ack_delay": 15, "srq": True, "local_qkey": 0x11223344}  # fmt: skip


def test_req_bytes_at_the_spec_offsets() -> None:
    alt = ib_path(slid=0x33, dlid=0x44, sgid=IPv6Address("fe80::3"),
                  dgid=IPv6Address("fe80::4"), flow_label=0xFEDCB, tclass=0x11, sl=3, rate=7,
                  packet_life_time=10)  # fmt: skip
    b = W.build_req(make_req(alt_path=alt), **REQ_FACTS)
    assert len(b) == 232
    assert u32(b, 0) == 0x6EC0C56D
    assert u64(b, 8) == 0x0106_1C06
    assert u64(b, 16) == 0x0002_C903_00AB_CDEF
    assert u32(b, 28) == 0x11223344
    assert u24(b, 32) == 0xABCDEF and b[35] == 0xA5  # local QPN, responder resources
    assert u24(b, 36) == 0 and b[39] == 0x3C  # local EECN, initiator depth
    # remote CM response timeout (5) | transport type (2) RC=0 | end-to-end flow control (1)
    assert u24(b, 40) == 0 and b[43] == (21 << 3) | (0 << 1) | 1
    assert u24(b, 44) == 0x123456 and b[47] == (19 << 3) | 6  # local CM resp. timeout, retry
    assert u16(b, 48) == 0x8123  # P_Key: the primary path's
    assert b[50] == (4 << 4) | (0 << 3) | 5  # path MTU, RDC exists, RNR retry count
    assert b[51] == (11 << 4) | (1 << 3) | 0  # max CM retries, SRQ, extended transport
    for at, p, ack in ((52, ib_path(), 16), (96, alt, 15)):
        assert u16(b, at) == p["slid"] and u16(b, at + 2) == p["dlid"]
        assert b[at + 4 : at + 20] == p["sgid"].packed
        assert b[at + 20 : at + 36] == p["dgid"].packed
        assert u32(b, at + 36) >> 12 == p["flow_label"]
        assert b[at + 39] & 0x3F == p["rate"]
        assert b[at + 40] == p["tclass"] and b[at + 41] == p["hop_limit"]
        assert b[at + 42] >> 4 == p["sl"] and (b[at + 42] >> 3) & 1 == 1  # subnet local
        # local ACK timeout = cm_ack_timeout(15, life): 16 for life 14, 15 for life 10
        assert b[at + 43] >> 3 == W.cm_ack_timeout(15, p["packet_life_time"]) == ack
    assert b[140:149] == b"\x00\x40\x1c\x06hello" and b[149:] == bytes(232 - 149)


def test_req_on_roce_has_the_linux_facts() -> None:
    """roce-wire.md 3.4: a REQ over RoCE as the kernel's rdma_cm sends it."""
    r = R.CmReq(svc_id=0x0106_1C06, primary_path=roce_path(), qp=QP, rep_cb=_cb,
                pdata=b"\x00\x40")  # fmt: skip
    b = W.build_req(r, local_comm_id=1, local_ca_guid=2, local_qpn=3, starting_psn=4,
                    ca_ack_delay=15)  # fmt: skip
    assert u16(b, 52) == u16(b, 54) == 65535  # permissive LIDs beyond one hop
    assert b[56:72] == GID_A.packed and b[72:88] == GID_B.packed
    assert b[93] == 64 and b[92] == 0  # hop limit, traffic class
    assert (b[94] >> 3) & 1 == 0  # SubnetLocal 0
    assert b[50] >> 4 == 3  # MTU 1024
    assert b[43] >> 3 == 20 and b[47] >> 3 == 20  # remote and local CM response timeouts
    assert b[47] & 7 == 7 and b[50] & 7 == 7  # retry 7, RNR retry 7
    assert b[51] >> 4 == 15  # max CM retries
    assert b[95] >> 3 == 17  # local ACK timeout = cm_ack_timeout(15, 16)
    assert u16(b, 48) == 0xFFFF
    assert b[96:140] == bytes(44)  # no alternate path
    # one hop on RoCE (hop limit 1): real LIDs and SubnetLocal, as cm_format_req does
    near = W.build_req(R.CmReq(svc_id=1, primary_path=roce_path(hop_limit=1, slid=7, dlid=8),
                               qp=QP, rep_cb=_cb),
                       local_comm_id=1, local_ca_guid=2, local_qpn=3, starting_psn=4,
                       ca_ack_delay=15)  # fmt: skip
    assert (u16(near, 52), u16(near, 54), (near[94] >> 3) & 1) == (7, 8, 1)


def test_rep_bytes_at_the_spec_offsets() -> None:
    req = W.parse(CmAttr.REQ, W.build_req(make_req(), **REQ_FACTS))
    rep = R.CmRep(qp=QP, pdata=b"accept", init_depth=0x21, target_ack_delay=15,
                  failover_accepted=R.CmFailover.ERROR, flow_ctrl=True,
                  rnr_retry_cnt=7)  # fmt: skip
    b = W.build_rep(rep, req=req, local_comm_id=0xCAFEBABE, local_ca_guid=0x1122334455667788,
                    local_qpn=0x010203, starting_psn=0xFEDCBA, resp_res=0x17, srq=True,
                    local_qkey=0x01234567)  # fmt: skip
    assert u32(b, 0) == 0xCAFEBABE and u32(b, 4) == 0x6EC0C56D  # local / remote comm ID
    assert u32(b, 8) == 0x01234567
    assert u24(b, 12) == 0x010203 and u24(b, 16) == 0 and u24(b, 20) == 0xFEDCBA
    assert b[24] == 0x17 and b[25] == 0x21
    assert b[26] == (15 << 3) | (2 << 1) | 1  # target ACK delay, failover accepted, e2e
    assert b[27] >> 5 == 7 and (b[27] >> 4) & 1 == 1  # RNR retry count, SRQ
    assert u64(b, 28) == 0x1122334455667788
    assert b[36:42] == b"accept" and b[42:] == bytes(232 - 42)
    # the responder resources default to the REQ's initiator depth
    dflt = W.build_rep(rep, req=req, local_comm_id=1, local_ca_guid=2, local_qpn=3,
                       starting_psn=4)  # fmt: skip
    assert dflt[24] == 0x3C
    # TargetACKDelay 0 in the record: the CA's ACK delay goes out, as Linux always sends it
    own = W.build_rep(R.CmRep(qp=QP), req=req, local_comm_id=1, local_ca_guid=2, local_qpn=3,
                      starting_psn=4, ca_ack_delay=15)  # fmt: skip
    assert own[26] >> 3 == 15 and dflt[26] >> 3 == 15  # the record's 15 wins when given


def test_rep_init_depth_may_not_pass_the_requests_responder_resources() -> None:
    req = W.parse(CmAttr.REQ, W.build_req(make_req(resp_res=2), **REQ_FACTS))
    with pytest.raises(InvalidSetting, match="init_depth is 3; at most the request's resp_res 2"):
        W.build_rep(R.CmRep(qp=QP, init_depth=3), req=req, local_comm_id=1, local_ca_guid=2,
                    local_qpn=3, starting_psn=4)  # fmt: skip


def test_short_messages_at_the_spec_offsets() -> None:
    ids = {"local_comm_id": 0x01020304, "remote_comm_id": 0x05060708}
    for b in (W.build_rtu(R.CmRtu(pdata=b"rtu"), **ids),
              W.build_drep(R.CmDrep(pdata=b"rtu"), **ids)):  # fmt: skip
        assert (u32(b, 0), u32(b, 4), b[8:11], b[11:]) == (*ids.values(), b"rtu", bytes(221))
    rej = W.build_rej(R.CmRej(rej_status=RejReason.CONSUMER_DEFINED, ari=b"\xaa" * 5,
                              pdata=b"no"), rejected=MessageMraed.REP, **ids)  # fmt: skip
    assert (u32(rej, 0), u32(rej, 4)) == tuple(ids.values())
    assert rej[8] >> 6 == 1 and rej[9] >> 1 == 5  # message rejected REP, ARI length
    assert u16(rej, 10) == 28 and rej[12:17] == b"\xaa" * 5 and rej[17:84] == bytes(67)
    assert rej[84:86] == b"no"
    mra = W.build_mra(R.CmMra(svc_timeout=24, pdata=b"wait"), mraed=MessageMraed.LAP, **ids)
    assert mra[8] >> 6 == 2 and mra[9] >> 3 == 24 and mra[10:14] == b"wait"
    dreq = W.build_dreq(R.CmDreq(qp=QP, pdata=b"bye"), remote_qpn=0xABCDEF, **ids)
    assert u24(dreq, 8) == 0xABCDEF and dreq[11] == 0 and dreq[12:15] == b"bye"
    apr = W.build_apr(R.CmApr(qp=QP, apr_status=R.AprStatus.INVALID_LID, info=b"\x01\x02",
                              pdata=b"apr"), **ids)  # fmt: skip
    assert apr[8] == 2 and apr[9] == 7 and apr[12:14] == b"\x01\x02" and apr[84:87] == b"apr"


def test_lap_bytes() -> None:
    alt = ib_path(hop_limit=1, slid=0x0101, dlid=0x0202, packet_life_time=18)
    lap = R.CmLap(qp=QP, alt_path=alt, apr_cb=_cb, remote_resp_timeout=22, pdata=b"lap")
    b = W.build_lap(lap, local_comm_id=1, remote_comm_id=2, remote_qpn=0x0A0B0C,
                    ca_ack_delay=15)  # fmt: skip
    assert u24(b, 12) == 0x0A0B0C and b[15] >> 3 == 22
    assert u16(b, 20) == 0x0101 and u16(b, 22) == 0x0202
    assert b[24:40] == alt["sgid"].packed and b[40:56] == alt["dgid"].packed
    assert u32(b, 56) >> 12 == 0x12345 and b[59] == 0x5A and b[60] == 1
    assert b[61] & 0x3F == 6 and b[62] >> 4 == 9 and (b[62] >> 3) & 1 == 1
    assert b[63] >> 3 == W.cm_ack_timeout(15, 18) == 19
    assert b[64:67] == b"lap"


def test_sidr_bytes_at_the_spec_offsets() -> None:
    sreq = R.CmReq(svc_id=0x0111_0000_1234, qp_type=QpType.UD, rep_cb=_cb, pkey=0xFFFF,
                   pdata=b"sidr")  # fmt: skip
    b = W.build_sidr_req(sreq, request_id=0xDEADBEEF)
    assert u32(b, 0) == 0xDEADBEEF and u16(b, 4) == 0xFFFF and u64(b, 8) == 0x0111_0000_1234
    assert b[16:20] == b"sidr"
    srep = R.CmRep(qp=QP, qp_type=QpType.UD, status=R.SidrStatus.REDIRECT,
                   class_info=b"\x07" * 10, pdata=b"rep")  # fmt: skip
    b = W.build_sidr_rep(srep, request_id=0xDEADBEEF, service_id=0x0111_0000_1234,
                         qpn=0x00ABCD, qkey=0x01234567)  # fmt: skip
    assert u32(b, 0) == 0xDEADBEEF and b[4] == 4 and b[5] == 10
    assert u24(b, 8) == 0x00ABCD and u64(b, 12) == 0x0111_0000_1234 and u32(b, 20) == 0x01234567
    assert b[24:34] == b"\x07" * 10 and b[96:99] == b"rep"


def test_sidr_req_pkey_falls_back_to_the_path() -> None:
    sreq = R.CmReq(svc_id=5, qp_type=QpType.UD, rep_cb=_cb, primary_path=ib_path())
    assert u16(W.build_sidr_req(sreq, request_id=1), 4) == 0x8123


# ------------------------------------------------------------------ round trips


def _roundtrip(attr: CmAttr, data: bytes) -> dict[str, Any]:
    tid = 0x0000_0002_6DC5_C06E
    msg = cm.parse_cm(W.mad(attr, tid, data))
    assert (msg.attr, msg.tid) == (attr, tid)
    assert H.header(W.mad(attr, tid, data)).attr_id == attr
    assert msg.fields == W.parse(attr, data)
    return msg.fields


def test_req_round_trip_to_the_passive_record() -> None:
    alt = ib_path(sgid=IPv6Address("fe80::3"), dgid=IPv6Address("fe80::4"), slid=5, dlid=6)
    f = _roundtrip(CmAttr.REQ, W.build_req(make_req(alt_path=alt), **REQ_FACTS))
    rec = W.req_rec(f)
    assert rec == R.CmReqRec(
        pdata=b"\x00\x40\x1c\x06hello" + bytes(83), qp_type=QpType.RC, svc_id=0x0106_1C06,
        resp_res=0xA5, init_depth=0x3C, flow_ctrl=True, rnr_retry_cnt=5,
        primary_path=rec.primary_path, alt_path=rec.alt_path, pkey=0x8123,
        remote_ca_guid=0x0002_C903_00AB_CDEF, remote_qpn=0xABCDEF,
    )  # fmt: skip
    # the passive side's paths: its GID/LID is the REQ's remote one
    p, a = rec.primary_path, rec.alt_path
    assert p is not None and a is not None
    assert (p["sgid"], p["dgid"], p["slid"], p["dlid"]) == (
        ib_path()["dgid"].packed, ib_path()["sgid"].packed, 0x22, 0x11)
    assert (a["sgid"], a["dgid"], a["slid"], a["dlid"]) == (
        IPv6Address("fe80::4").packed, IPv6Address("fe80::3").packed, 6, 5)
    assert (p["flow_label"], p["tclass"], p["sl"], p["mtu"], p["p_key"], p["rate"]) == (
        0x12345, 0x5A, 9, 4, 0x8123, 6)
    assert p["packet_life_time"] == W.cm_ack_timeout(15, 14) - 1
    # complete PathRecords: the SA table encodes them, and they validate as CM paths
    assert PATH_RECORD.decode(PATH_RECORD.encode(p)) == {**PATH_RECORD.decode(bytes(64)), **p}
    R.check_path("p", p)
    # the active side's view gives the original path back
    act = W.path_from_req(f, passive=False)
    assert (act["sgid"], act["dgid"], act["slid"], act["dlid"]) == (
        ib_path()["sgid"].packed, ib_path()["dgid"].packed, 0x11, 0x22)
    # a REQ without an alternate path has none in its record
    assert W.req_rec(W.parse(CmAttr.REQ, W.build_req(make_req(), **REQ_FACTS))).alt_path is None


def test_paths_from_the_sa_decode_are_accepted() -> None:
    """A PathRecord as ibal.sa.query returns it (GIDs as bytes, every field) builds a REQ."""
    raw = PATH_RECORD.encode({**ib_path(), "sgid": ib_path()["sgid"].packed,
                              "dgid": ib_path()["dgid"].packed, "reversible": 1})  # fmt: skip
    rec = Record(PATH_RECORD, raw)
    a = W.build_req(make_req(primary_path=rec), **REQ_FACTS)
    b = W.build_req(make_req(), **REQ_FACTS)
    assert a == b


def test_a_path_from_ibal_sa_roce_builds_the_roce_req() -> None:
    """ibal.sa.roce's resolver output (no LIDs in its record) as the REQ's primary path."""
    from ibal.sa import roce
    from ibal.sa.roce_net import NUD_VALID, Link, Neighbour, Route
    from ibal.types import GidEntry, GidType, LinkLayer, Mtu, PortAttr

    entry = GidEntry(3, GID_A, GidType.ROCE_V2, "eth0")
    port = PortAttr(port_num=1, port_guid=1, link_layer=LinkLayer.ETHERNET,
                    active_mtu=Mtu.MTU_4096, gid_table=(entry,))  # fmt: skip
    eth = Link(2, "eth0", b"\x02\x00\x00\x00\x00\x01", 1500)
    dst = GID_B.ipv4_mapped
    assert dst is not None
    got = roce.resolve(roce.PathQuery(GID_B), port, entry, Route(dst, 2), eth, eth,
                       Neighbour(dst, 2, NUD_VALID, b"\x02\x00\x00\x00\x00\x02"), 64)  # fmt: skip
    assert isinstance(got, roce.RocePath) and "dlid" not in got.record
    b = W.build_req(R.CmReq(svc_id=0x0106_1C06, primary_path=got.record, qp=QP, rep_cb=_cb),
                    local_comm_id=1, local_ca_guid=2, local_qpn=3, starting_psn=4,
                    ca_ack_delay=15)  # fmt: skip
    assert u16(b, 52) == u16(b, 54) == 0xFFFF and b[93] == 64 and (b[94] >> 3) & 1 == 0
    assert b[50] >> 4 == 3 and b[95] >> 3 == 17  # MTU 1024 for a 1500-byte netdev; 17
    assert b[56:72] == GID_A.packed and b[72:88] == GID_B.packed


def test_rep_round_trip() -> None:
    req = W.parse(CmAttr.REQ, W.build_req(make_req(), **REQ_FACTS))
    rep = R.CmRep(qp=QP, pdata=b"r", init_depth=3, failover_accepted=R.CmFailover.SUCCESS,
                  flow_ctrl=True)  # fmt: skip
    f = _roundtrip(CmAttr.REP, W.build_rep(rep, req=req, local_comm_id=9, local_ca_guid=8,
                                           local_qpn=7, starting_psn=6, resp_res=5))  # fmt: skip
    assert (f["local_comm_id"], f["remote_comm_id"], f["local_ca_guid"]) == (9, 0x6EC0C56D, 8)
    assert W.rep_rec(f) == R.CmRepRec(pdata=b"r" + bytes(195), resp_res=5, flow_ctrl=True,
                                      apr_status=R.CmFailover.SUCCESS)  # fmt: skip


def test_every_other_message_round_trips_to_its_record() -> None:
    ids = {"local_comm_id": 0x11, "remote_comm_id": 0x22}
    f = _roundtrip(CmAttr.RTU, W.build_rtu(R.CmRtu(pdata=b"x"), **ids))
    assert W.to_rec(CmAttr.RTU, f) == R.CmRtuRec(pdata=b"x" + bytes(223))
    f = _roundtrip(CmAttr.REJ, W.build_rej(R.CmRej(rej_status=RejReason.INVALID_GID,
                                                   ari=bytes(range(16))),
                                           rejected=MessageMraed.REQ, **ids))  # fmt: skip
    assert W.to_rec(CmAttr.REJ, f) == R.CmRejRec(
        rej_status=RejReason.INVALID_GID, ari=bytes(range(16)), pdata=bytes(148))
    f = _roundtrip(CmAttr.MRA, W.build_mra(R.CmMra(svc_timeout=9), mraed=MessageMraed.REQ,
                                           **ids))  # fmt: skip
    assert W.to_rec(CmAttr.MRA, f) == R.CmMraRec(pdata=bytes(222), svc_timeout=9)
    f = _roundtrip(CmAttr.DREQ, W.build_dreq(R.CmDreq(qp=QP, pdata=b"d"), remote_qpn=5, **ids))
    assert W.to_rec(CmAttr.DREQ, f) == R.CmDreqRec(pdata=b"d" + bytes(219))
    f = _roundtrip(CmAttr.DREP, W.build_drep(R.CmDrep(), **ids))
    assert W.to_rec(CmAttr.DREP, f) == R.CmDrepRec(pdata=bytes(224))
    f = _roundtrip(CmAttr.APR, W.build_apr(R.CmApr(qp=QP, apr_status=R.AprStatus.REJECT,
                                                   info=b"why"), **ids))  # fmt: skip
    assert W.to_rec(CmAttr.APR, f) == R.CmAprRec(apr_status=R.AprStatus.REJECT, info=b"why",
                                                 pdata=bytes(148))  # fmt: skip
    alt = roce_path(sgid=IPv6Address("::ffff:10.9.0.1"), dgid=IPv6Address("::ffff:10.9.0.2"))
    f = _roundtrip(CmAttr.LAP, W.build_lap(R.CmLap(qp=QP, alt_path=alt, apr_cb=_cb),
                                           remote_qpn=1, ca_ack_delay=15, **ids))  # fmt: skip
    lap = W.to_rec(CmAttr.LAP, f, pkey=0xFFFF, mtu=3)
    assert isinstance(lap, R.CmLapRec) and lap.pdata == bytes(168)
    assert (lap.alt_path["sgid"], lap.alt_path["dgid"]) == (alt["dgid"].packed,
                                                             alt["sgid"].packed)  # fmt: skip
    assert (lap.alt_path["p_key"], lap.alt_path["mtu"], lap.alt_path["hop_limit"]) == (
        0xFFFF, 3, 64)
    assert (lap.alt_path["slid"], lap.alt_path["dlid"]) == (0xFFFF, 0xFFFF)
    sreq = R.CmReq(svc_id=0x77, qp_type=QpType.UD, rep_cb=_cb, pkey=0x8001, pdata=b"q")
    f = _roundtrip(CmAttr.SIDR_REQ, W.build_sidr_req(sreq, request_id=3))
    assert W.to_rec(CmAttr.SIDR_REQ, f) == R.CmReqRec(pdata=b"q" + bytes(215),
                                                      qp_type=QpType.UD, svc_id=0x77,
                                                      pkey=0x8001)  # fmt: skip
    srep = R.CmRep(qp=QP, qp_type=QpType.UD, pdata=b"a")
    f = _roundtrip(CmAttr.SIDR_REP, W.build_sidr_rep(srep, request_id=3, service_id=0x77,
                                                     qpn=0x1234, qkey=0x0123_4567))  # fmt: skip
    assert W.to_rec(CmAttr.SIDR_REP, f) == R.CmRepRec(
        pdata=b"a" + bytes(135), qp_type=QpType.UD, status=R.SidrStatus.SUCCESS,
        remote_qp=0x1234, remote_qkey=0x0123_4567)  # fmt: skip


def test_unknown_reasons_from_a_peer_still_convert() -> None:
    data = bytearray(232)
    data[10:12] = (0x1234).to_bytes(2, "big")
    data[9] = 100 << 1  # an ARI length past 72 is cut to 72
    rec = W.rej_rec(W.parse(CmAttr.REJ, bytes(data)))
    assert rec.rej_status == 0x1234 and len(rec.ari) == 72
    srep = bytearray(232)
    srep[4] = 9
    assert W.sidr_rep_rec(W.parse(CmAttr.SIDR_REP, bytes(srep))).status is R.SidrStatus.REJECT
    apr = bytearray(232)
    apr[9] = 200
    assert W.apr_rec(W.parse(CmAttr.APR, bytes(apr))).apr_status == 200
    rep = bytearray(232)
    rep[26] = 3 << 1  # failover accepted 3 (reserved)
    assert W.rep_rec(W.parse(CmAttr.REP, bytes(rep))).apr_status is R.CmFailover.ERROR


def test_builders_refuse_the_wrong_request_kind_and_bad_local_facts() -> None:
    sidr = R.CmReq(svc_id=1, qp_type=QpType.UD, rep_cb=_cb, pkey=0xFFFF)
    with pytest.raises(InvalidParameter, match="use build_sidr_req"):
        W.build_req(sidr, **REQ_FACTS)
    with pytest.raises(InvalidParameter, match="SIDR_REQ comes from a UD request"):
        W.build_sidr_req(make_req(), request_id=1)
    with pytest.raises(InvalidSetting, match="local_qpn"):
        W.build_req(make_req(), **{**REQ_FACTS, "local_qpn": 1 << 24})
    with pytest.raises(InvalidParameter, match="acknowledges a REQ, REP or LAP"):
        W.build_mra(R.CmMra(), local_comm_id=1, remote_comm_id=2, mraed=MessageMraed.OTHER)
    with pytest.raises(InvalidParameter, match="232 bytes"):
        W.mad(CmAttr.RTU, 1, bytes(10))


def test_qp_type_of_refuses_rd() -> None:
    f = W.parse(CmAttr.REQ, W.build_req(make_req(qp_type=QpType.UC), **REQ_FACTS))
    assert W.qp_type_of(f) is QpType.UC and f["transport_type"] == 1
    with pytest.raises(InvalidSetting, match="transport type 2"):
        W.qp_type_of({**f, "transport_type": 2})


# ------------------------------------------------------------------ timers


@pytest.mark.parametrize(("t", "ms"), [(0, 1), (8, 1), (9, 2), (16, 256), (18, 1024),
                                       (20, 4096), (31, 8388608)])  # fmt: skip
def test_cm_convert_to_ms(t: int, ms: int) -> None:
    assert W.cm_convert_to_ms(t) == ms


@pytest.mark.parametrize(("delay", "life", "ack"), [
    (15, 16, 17),  # rxe's ACK delay and CMA_IBOE_PACKET_LIFETIME: the captured 17
    (0, 16, 17), (17, 16, 18), (18, 16, 19), (20, 16, 20), (15, 14, 16), (15, 10, 15),
    (15, 18, 19), (31, 31, 31), (0, 0, 2),
])  # fmt: skip
def test_cm_ack_timeout(delay: int, life: int, ack: int) -> None:
    assert W.cm_ack_timeout(delay, life) == ack


def test_retransmit_and_other_timeouts() -> None:
    # roce-wire.md 3.5: 2*256 + 4096 with life 16, 2*1024 + 4096 with life 18
    assert W.retransmit_timeout_ms(16, 20) == 4608
    assert W.retransmit_timeout_ms(18, 20) == 6144
    assert W.mra_timeout_ms(24, 17) == 65536 + 512
    assert W.timewait_ms(17) == 512
    assert W.sidr_timeout_ms(100, 16) == 100 + 512


# ------------------------------------------------------------------ properties


@given(data=st.binary(min_size=232, max_size=232),
       attr=st.sampled_from([a for a in CmAttr if a is not CmAttr.CLASS_PORT_INFO]))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_any_data_area_converts_to_a_record(data: bytes, attr: CmAttr) -> None:
    """Whatever a peer sends, decoding and conversion never fail but for the one
    documented case (a REQ of a transport the CM does not serve)."""
    fields = W.parse(attr, data)
    try:
        rec = W.to_rec(attr, fields)
    except W.PathMismatch as e:
        assert attr is CmAttr.REQ and e.reason is RejReason.INVALID_TRANSPORT_TYPE
        assert fields["transport_type"] in (2, 3)
        return
    assert len(rec.pdata) == R.PDATA_MAX[attr]


_u = st.integers
_paths = st.builds(
    lambda hop, lids, life, mtu, fl, tc, sl, rate, pkey: ib_path(
        hop_limit=hop, slid=lids[0], dlid=lids[1], packet_life_time=life, mtu=mtu,
        flow_label=fl, tclass=tc, sl=sl, rate=rate, p_key=pkey),
    _u(0, 255), st.tuples(_u(0, 0xFFFF), _u(0, 0xFFFF)), _u(0, 30), _u(1, 5),
    _u(0, 0xFFFFF), _u(0, 255), _u(0, 15), _u(0, 63), _u(1, 0x7FFF) | _u(0x8001, 0xFFFF),
)  # fmt: skip


@given(path=_paths, resp=_u(0, 255), depth=_u(0, 255), retries=_u(0, 15), rto=_u(0, 31),
       lto=_u(0, 31), rnr=_u(0, 7), retry=_u(0, 7), fc=st.booleans(),
       pd=st.binary(max_size=92), psn=_u(0, 0xFFFFFF), delay=_u(0, 31),
       uc=st.booleans())  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_req_round_trips_for_any_valid_request(path: dict[str, Any], resp: int, depth: int,
                                               retries: int, rto: int, lto: int, rnr: int,
                                               retry: int, fc: bool, pd: bytes, psn: int,
                                               delay: int, uc: bool) -> None:  # fmt: skip
    r = make_req(primary_path=path, resp_res=resp, init_depth=depth, max_cm_retries=retries,
                 remote_resp_timeout=rto, local_resp_timeout=lto, rnr_retry_cnt=rnr,
                 retry_cnt=retry, flow_ctrl=fc, pdata=pd,
                 qp_type=QpType.UC if uc else QpType.RC)  # fmt: skip
    f = W.parse(CmAttr.REQ, W.build_req(r, **{**REQ_FACTS, "starting_psn": psn,
                                              "ca_ack_delay": delay}))  # fmt: skip
    rec = W.req_rec(f)
    assert (rec.resp_res, rec.init_depth, rec.rnr_retry_cnt, rec.flow_ctrl) == (
        resp, depth, rnr, fc)
    assert rec.qp_type is r.qp_type and rec.pdata[: len(pd)] == pd and rec.svc_id == r.svc_id
    assert (f["max_cm_retries"], f["remote_cm_response_timeout"],
            f["local_cm_response_timeout"], f["retry_count"], f["starting_psn"]) == (
        retries, rto, lto, retry, psn)  # fmt: skip
    back = W.path_from_req(f, passive=False)
    one_hop = path["hop_limit"] <= 1
    for k in ("flow_label", "hop_limit", "tclass", "sl", "rate", "mtu", "p_key"):
        assert back[k] == path[k], k
    assert (back["slid"], back["dlid"]) == (
        (path["slid"], path["dlid"]) if one_hop else (0xFFFF, 0xFFFF))
    assert (back["sgid"], back["dgid"]) == (path["sgid"].packed, path["dgid"].packed)
    assert back["packet_life_time"] == W.cm_ack_timeout(delay, path["packet_life_time"]) - 1
    R.check_path("back", back)  # what the passive side gets is itself a usable path


@pytest.mark.parametrize("alt", [None, ib_path(slid=0x33, dlid=0x44, sgid=IPv6Address("fe80::3"),
                                                dgid=IPv6Address("fe80::4"))])
def test_req_and_rep_messages_give_the_fields_their_bytes_decode_to(alt: Any) -> None:
    """The fields the CM keeps of what it sent come from the encode's own check, not a
    decode of the bytes: they must be what the decode reads, field for field."""
    msg, fields = W.req_message(make_req(alt_path=alt), **REQ_FACTS)
    assert msg == W.build_req(make_req(alt_path=alt), **REQ_FACTS)
    assert fields == W.parse(CmAttr.REQ, msg) and list(fields) == list(W.parse(CmAttr.REQ, msg))
    rep = R.CmRep(qp=QP, pdata=b"accept", init_depth=3, flow_ctrl=True, rnr_retry_cnt=7)
    msg, fields = W.rep_message(rep, req=W.parse(CmAttr.REQ, msg), local_comm_id=1,
                                local_ca_guid=2, local_qpn=3, starting_psn=4, srq=True)  # fmt: skip
    assert fields == W.parse(CmAttr.REP, msg)
    with pytest.raises(InvalidSetting):  # a local fact out of range is the caller's setting
        W.req_message(make_req(), **{**REQ_FACTS, "local_qpn": 1 << 24})
