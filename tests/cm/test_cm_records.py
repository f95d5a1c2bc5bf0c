"""ibal.cm.records: the IBAL CM requests check themselves with the seed's statuses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from ipaddress import IPv6Address
from typing import Any

import pytest

from ibal.cm import records as R
from ibal.cm import wire as W
from ibal.status import InvalidParameter, InvalidSetting, Status
from ibal.types import AccessFlags, QpType
from ibal.wire.mad.cm import CmAttr, MessageMraed

QP = object()  # a stand-in handle: records keep it, they never touch it


def _cb(*_: Any) -> None:
    return None


PATH: dict[str, Any] = {
    "sgid": IPv6Address("::ffff:10.0.0.1"), "dgid": IPv6Address("::ffff:10.0.0.2"),
    "slid": 0, "dlid": 0, "flow_label": 0, "hop_limit": 64, "tclass": 0, "p_key": 0xFFFF,
    "sl": 0, "mtu": 3, "rate": 16, "packet_life_time": 16,
}  # fmt: skip


def req(**kw: Any) -> R.CmReq:
    base: dict[str, Any] = {"svc_id": 0x1061C06, "primary_path": PATH, "qp": QP, "rep_cb": _cb}
    return R.CmReq(**{**base, **kw})


# The IBAL/IBA numbers, written out here rather than read from the tables they check.
LIMITS = {
    CmAttr.REQ: 92, CmAttr.REP: 196, CmAttr.RTU: 224, CmAttr.REJ: 148, CmAttr.MRA: 222,
    CmAttr.DREQ: 220, CmAttr.DREP: 224, CmAttr.LAP: 168, CmAttr.APR: 148,
    CmAttr.SIDR_REQ: 216, CmAttr.SIDR_REP: 136,
}  # fmt: skip

MAKERS: dict[CmAttr, Callable[[bytes], Any]] = {
    CmAttr.REQ: lambda pd: req(pdata=pd),
    CmAttr.SIDR_REQ: lambda pd: req(pdata=pd, qp_type=QpType.UD, primary_path=None,
                                    pkey=0xFFFF),
    CmAttr.REP: lambda pd: R.CmRep(qp=QP, pdata=pd),
    CmAttr.SIDR_REP: lambda pd: R.CmRep(qp=QP, pdata=pd, qp_type=QpType.UD),
    CmAttr.RTU: lambda pd: R.CmRtu(pdata=pd),
    CmAttr.REJ: lambda pd: R.CmRej(pdata=pd),
    CmAttr.MRA: lambda pd: R.CmMra(pdata=pd),
    CmAttr.DREQ: lambda pd: R.CmDreq(qp=QP, pdata=pd),
    CmAttr.DREP: lambda pd: R.CmDrep(pdata=pd),
    CmAttr.LAP: lambda pd: R.CmLap(qp=QP, alt_path=PATH, apr_cb=_cb, pdata=pd),
    CmAttr.APR: lambda pd: R.CmApr(qp=QP, pdata=pd),
}  # fmt: skip

# Each message built from its record: the private data must land at the end of the data area.
BUILDERS: dict[CmAttr, Callable[[Any], bytes]] = {
    CmAttr.REQ: lambda r: W.build_req(r, local_comm_id=1, local_ca_guid=2, local_qpn=3,
                                      starting_psn=4, ca_ack_delay=15),
    CmAttr.SIDR_REQ: lambda r: W.build_sidr_req(r, request_id=1),
    CmAttr.REP: lambda r: W.build_rep(r, req=W.parse(CmAttr.REQ, BUILDERS[CmAttr.REQ](req())),
                                      local_comm_id=5, local_ca_guid=6, local_qpn=7,
                                      starting_psn=8),
    CmAttr.SIDR_REP: lambda r: W.build_sidr_rep(r, request_id=1, service_id=2, qpn=3, qkey=4),
    CmAttr.RTU: lambda r: W.build_rtu(r, local_comm_id=1, remote_comm_id=2),
    CmAttr.REJ: lambda r: W.build_rej(r, local_comm_id=1, remote_comm_id=2,
                                      rejected=MessageMraed.REQ),
    CmAttr.MRA: lambda r: W.build_mra(r, local_comm_id=1, remote_comm_id=2,
                                      mraed=MessageMraed.REQ),
    CmAttr.DREQ: lambda r: W.build_dreq(r, local_comm_id=1, remote_comm_id=2, remote_qpn=3),
    CmAttr.DREP: lambda r: W.build_drep(r, local_comm_id=1, remote_comm_id=2),
    CmAttr.LAP: lambda r: W.build_lap(r, local_comm_id=1, remote_comm_id=2, remote_qpn=3,
                                      ca_ack_delay=15),
    CmAttr.APR: lambda r: W.build_apr(r, local_comm_id=1, remote_comm_id=2),
}  # fmt: skip


def test_pdata_sizes_are_the_ibal_v2_numbers() -> None:
    assert dict(R.PDATA_MAX) == LIMITS
    sizes = (R.REQ_PDATA_SIZE, R.REP_PDATA_SIZE, R.RTU_PDATA_SIZE, R.REJ_PDATA_SIZE,
             R.MRA_PDATA_SIZE, R.DREQ_PDATA_SIZE, R.DREP_PDATA_SIZE, R.LAP_PDATA_SIZE,
             R.APR_PDATA_SIZE, R.SIDR_REQ_PDATA_SIZE, R.SIDR_REP_PDATA_SIZE)  # fmt: skip
    assert sizes == (92, 196, 224, 148, 222, 220, 224, 168, 148, 216, 136)
    assert R.ARI_SIZE == R.APR_INFO_SIZE == 72


@pytest.mark.parametrize("attr", list(LIMITS), ids=lambda a: a.name)
def test_pdata_limit_accepted_and_one_more_rejected(attr: CmAttr) -> None:
    limit = LIMITS[attr]
    pd = bytes(range(1, 256))[:limit - 1] + b"\xee"
    ok = MAKERS[attr](pd)
    ok.validate()
    data = BUILDERS[attr](ok)
    assert len(data) == 232 and data[232 - limit:] == pd  # the last byte is the message's last
    too_long = MAKERS[attr](pd + b"\x01")
    name = attr.name
    with pytest.raises(InvalidSetting, match=f": {name} private data is {limit + 1} bytes; "
                                             f"at most {limit}$") as e:  # fmt: skip
        too_long.validate()
    assert e.value.status is Status.INVALID_SETTING
    with pytest.raises(InvalidSetting):
        BUILDERS[attr](too_long)  # the builders check too: nothing oversized is ever sent


def test_req_message_names_the_limit_as_the_brief_says() -> None:
    with pytest.raises(InvalidSetting) as e:
        req(pdata=bytes(93)).validate()
    assert str(e.value) == "IB_INVALID_SETTING: REQ private data is 93 bytes; at most 92"


def test_pdata_of_the_wrong_type_is_an_invalid_parameter() -> None:
    with pytest.raises(InvalidParameter, match="REQ private data must be bytes"):
        req(pdata="hello").validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        R.check_pdata(CmAttr.DREP, [1, 2])
    assert R.check_pdata(CmAttr.RTU, bytearray(b"ab")) == b"ab"


@pytest.mark.parametrize(("make", "what"), [
    (lambda b: R.CmRej(ari=b), "ARI"),
    (lambda b: R.CmApr(qp=QP, info=b), "APR additional information"),
    (lambda b: R.CmRep(qp=QP, qp_type=QpType.UD, class_info=b), "class_info"),
])  # fmt: skip
def test_ari_and_apr_info_hold_72_bytes(make: Callable[[bytes], Any], what: str) -> None:
    make(bytes(72)).validate()
    with pytest.raises(InvalidSetting, match=f"{what}.* is 73 bytes; at most 72"):
        make(bytes(73)).validate()


def test_constants() -> None:
    assert (R.ALL_CAS, R.ALL_PORTS, R.ALL_LIDS, R.ALL_PKEYS) == (0, 0, 0, 0)
    assert int(R.AlFlags.SYNC) == 1
    assert [int(f) for f in R.CmFailover] == [0, 1, 2]
    assert req(flags=R.AlFlags.SYNC).sync and not req().sync
    assert req().attr is CmAttr.REQ and req(qp_type=QpType.UD).attr is CmAttr.SIDR_REQ


@pytest.mark.parametrize(("field", "value", "exc", "message"), [
    ("retry_cnt", 8, InvalidSetting, "retry_cnt is 8; it must be 0..7"),
    ("rnr_retry_cnt", -1, InvalidSetting, "rnr_retry_cnt is -1; it must be 0..7"),
    ("max_cm_retries", 16, InvalidSetting, "max_cm_retries is 16; it must be 0..15"),
    ("remote_resp_timeout", 32, InvalidSetting, "remote_resp_timeout is 32; it must be 0..31"),
    ("local_resp_timeout", 40, InvalidSetting, "local_resp_timeout is 40; it must be 0..31"),
    ("resp_res", 256, InvalidSetting, "resp_res is 256; it must be 0..255"),
    ("init_depth", "4", InvalidParameter, "init_depth must be an int"),
    ("svc_id", 1 << 64, InvalidSetting, "svc_id is"),
    ("qp_type", QpType.RD, InvalidSetting, "qp_type RD is not supported"),
    ("qp_type", 0, InvalidParameter, "qp_type must be an ibal.types.QpType"),
    ("qp", None, InvalidParameter, "qp is required"),
    ("primary_path", None, InvalidParameter, "primary_path is required"),
    ("rep_cb", None, InvalidParameter, "rep_cb is required"),
    ("mra_cb", 5, InvalidParameter, "mra_cb must be callable"),
    ("flags", 2, InvalidParameter, "flags 2 is not an AlFlags"),
    ("compare_buffer", b"x", InvalidSetting, "peer-to-peer"),
])  # fmt: skip
def test_req_settings(field: str, value: Any, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message):
        req(**{field: value}).validate()


@pytest.mark.parametrize(("change", "exc", "message"), [
    ({"p_key": 0x8000}, InvalidSetting, "primary_path.p_key 0x8000 is not a valid P_Key"),
    ({"p_key": 0}, InvalidSetting, "not a valid P_Key"),
    ({"packet_life_time": 31}, InvalidSetting, "packet_life_time is 31; at most 30"),
    ({"mtu": 6}, InvalidSetting, "mtu 6 is not an IB MTU code"),
    ({"hop_limit": 256}, InvalidSetting, "hop_limit is 256"),
    ({"sgid": b"short"}, InvalidParameter, "primary_path.sgid must be a GID"),
    ({"dlid": None}, InvalidParameter, "primary_path.dlid must be an int"),
])  # fmt: skip
def test_path_settings(change: dict[str, Any], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message):
        req(primary_path={**PATH, **change}).validate()


def test_path_needs_its_gids_mtu_and_life_and_defaults_the_rest() -> None:
    partial = {k: v for k, v in PATH.items() if k not in ("mtu", "packet_life_time")}
    with pytest.raises(InvalidParameter, match="primary_path lacks mtu, packet_life_time"):
        req(primary_path=partial).validate()
    few = {k: PATH[k] for k in ("sgid", "dgid", "mtu", "packet_life_time")}
    assert R.check_path("p", few) == {
        "sgid": PATH["sgid"].packed, "dgid": PATH["dgid"].packed, "slid": 0, "dlid": 0,
        "flow_label": 0, "hop_limit": 0, "tclass": 0, "p_key": 0xFFFF, "sl": 0, "mtu": 3,
        "rate": 0, "packet_life_time": 16,
    }  # fmt: skip
    with pytest.raises(InvalidParameter, match="a PathRecord"):
        req(primary_path=42).validate()


def test_a_path_checked_once_is_checked_again_after_a_change() -> None:
    """check_path remembers a dict it passed (a route serves many connections), but by
    content too: changing the dict afterwards is seen, and the result is the caller's."""
    path = dict(PATH)
    first = R.check_path("primary_path", path)
    first["mtu"] = 99  # the caller's copy: not the remembered one
    assert R.check_path("primary_path", path)["mtu"] == PATH["mtu"]
    path["p_key"] = 0x8000
    with pytest.raises(InvalidSetting, match="not a valid P_Key"):
        R.check_path("primary_path", path)


def test_alternate_path_must_share_the_mtu() -> None:
    req(alt_path={**PATH, "dgid": IPv6Address("::ffff:10.0.1.2")}).validate()
    with pytest.raises(InvalidSetting, match="alt_path MTU code 4 differs from the primary "
                                             "path's 3"):  # fmt: skip
        req(alt_path={**PATH, "mtu": 4}).validate()


def test_compare_buffer_must_fit_the_private_data() -> None:
    req(req_cb=_cb, compare_buffer=b"ab", compare_offset=90).validate()
    msg = r"compare_offset 91 \+ compare_length 2 passes the end of the REQ private data \(92"
    with pytest.raises(InvalidSetting, match=msg):
        req(req_cb=_cb, compare_buffer=b"ab", compare_offset=91).validate()
    listen = R.CmListen(svc_id=1, req_cb=_cb, compare_buffer=b"abcd", compare_offset=88)
    listen.validate()
    assert listen.compare_length == 4
    with pytest.raises(InvalidSetting):
        dataclasses.replace(listen, compare_offset=89).validate()
    # SIDR listens compare against the SIDR_REQ's 216 bytes
    dataclasses.replace(listen, qp_type=QpType.UD, compare_offset=212).validate()
    R.CepListen(svc_id=1, compare_buffer=b"x", compare_offset=91).validate()
    with pytest.raises(InvalidSetting):
        R.CepListen(svc_id=1, compare_buffer=b"x", compare_offset=92).validate()


def test_listen_checks() -> None:
    with pytest.raises(InvalidParameter, match="req_cb is required"):
        R.CmListen(svc_id=1).validate()
    with pytest.raises(InvalidSetting, match="lid is 65536"):
        R.CmListen(svc_id=1, req_cb=_cb, lid=0x10000).validate()
    with pytest.raises(InvalidSetting, match="qp_type MAD"):
        R.CmListen(svc_id=1, req_cb=_cb, qp_type=QpType.MAD).validate()


def test_sidr_request_checks() -> None:
    sidr = req(qp_type=QpType.UD, primary_path=None, qp=None, pkey=0xFFFF, timeout_ms=100)
    sidr.validate()  # a SIDR request needs no QP and no path
    with pytest.raises(InvalidSetting, match="pkey 0x0000 is not a valid P_Key"):
        dataclasses.replace(sidr, pkey=0).validate()
    with pytest.raises(InvalidSetting, match="timeout_ms"):
        dataclasses.replace(sidr, timeout_ms=-1).validate()


def test_rep_checks_against_the_request() -> None:
    rec = R.CmReqRec(pdata=bytes(92), qp_type=QpType.RC, resp_res=4)
    R.CmRep(qp=QP, init_depth=4).validate(rec)
    with pytest.raises(InvalidSetting, match="init_depth is 5; at most the request's "
                                             "resp_res 4"):  # fmt: skip
        R.CmRep(qp=QP, init_depth=5).validate(rec)
    with pytest.raises(InvalidParameter, match="qp is required"):
        R.CmRep().validate()
    with pytest.raises(InvalidParameter, match="access_ctrl"):
        R.CmRep(qp=QP, access_ctrl=3).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidSetting, match="target_ack_delay is 32"):
        R.CmRep(qp=QP, target_ack_delay=32).validate()
    with pytest.raises(InvalidSetting, match="failover_accepted 3"):
        R.CmRep(qp=QP, failover_accepted=3).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="status SUCCESS names a qp"):
        R.CmRep(qp_type=QpType.UD).validate()
    R.CmRep(qp_type=QpType.UD, status=R.SidrStatus.NO_QP).validate()


def test_other_request_checks() -> None:
    with pytest.raises(InvalidSetting, match="svc_timeout is 32"):
        R.CmMra(svc_timeout=32).validate()
    with pytest.raises(InvalidSetting, match="rej_status is 65536"):
        R.CmRej(rej_status=0x10000).validate()
    with pytest.raises(InvalidParameter, match="alt_path is required"):
        R.CmLap(qp=QP, apr_cb=_cb).validate()
    with pytest.raises(InvalidParameter, match="apr_cb is required"):
        R.CmLap(qp=QP, alt_path=PATH).validate()
    with pytest.raises(InvalidSetting, match="qp_type UD"):
        R.CmDreq(qp=QP, qp_type=QpType.UD).validate()
    with pytest.raises(InvalidParameter, match="qp is required"):
        R.CmApr().validate()
    with pytest.raises(InvalidParameter, match="access_ctrl"):
        R.CmRtu(access_ctrl=1).validate()  # type: ignore[arg-type]
    R.CmRtu(access_ctrl=AccessFlags.LOCAL_WRITE, sq_depth=0).validate()


def test_records_are_frozen_and_keyword_only() -> None:
    r = req()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.retry_cnt = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        R.CmRtu(b"pd")  # type: ignore[misc]
    assert dataclasses.replace(r, retry_cnt=3).retry_cnt == 3
    err = R.ListenErrRec(listen_context="ctx", reason=Status.INVALID_LID)
    assert (err.listen_context, err.reason, err.listen) == ("ctx", Status.INVALID_LID, None)


def test_mapping_rows_name_real_records() -> None:
    import re

    from ibal.compat import IBAL_MAPPING

    rows = [(n, s) for n, s, st in IBAL_MAPPING if st == "done" and "ibal.cm.records" in s]
    assert len(rows) == 37  # 18 request/record pairs, ib_cm_listen_t and _failover_t, 3 listen
    # types, ib_al_flags_t, ib_ari_t, ib_apr_info_t and the 11 pdata types
    for name, spelling in rows:
        for attr in re.findall(r"ibal\.cm\.records\.(\w+)", spelling):
            assert hasattr(R, attr), (name, attr)
