"""CM messages and RMPP segments checked by an independent decoder: tshark's InfiniBand dissector.

Every message is encoded with random field values, carried in a RoCEv2 UD
frame to QP1 as Linux sends CM on RoCE, and tshark's decoded values must equal
the values encoded, with no malformed or expert mark.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
from pathlib import Path

import pytest
from mad_frames import tshark_fields

from ibal.transport.rmpp import RmppSender
from ibal.wire.fields import Kind, Table, Value
from ibal.wire.mad import cm
from ibal.wire.mad.rmpp import RmppHeader
from ibal.wire.tshark import tshark_path

pytestmark = pytest.mark.skipif(
    tshark_path() is None and not os.environ.get("IBAL_LAB_REQUIRED"),
    reason="tshark not installed (Debian package tshark)",
)

_REQ_PATH = {"local_lid": "locallid", "remote_lid": "remotelid", "local_gid": "localgid",
             "remote_gid": "remotegid", "flow_label": "flowlabel", "traffic_class": "tfcclass",
             "hop_limit": "hoplim", "sl": "sl", "subnet_local": "subnetlocal",
             "local_ack_timeout": "localacktout"}  # fmt: skip

NAMES: dict[cm.CmAttr, tuple[str, dict[str, str]]] = {
    cm.CmAttr.REQ: ("infiniband.cm.req", {
        "local_comm_id": "", "service_id": ".serviceid", "local_ca_guid": ".localcaguid",
        "local_qkey": ".localqkey", "local_qpn": ".localqpn",
        "responder_resources": ".responderres", "local_eecn": ".localeecn",
        "initiator_depth": ".initdepth", "remote_eecn": ".remoteeecn",
        "remote_cm_response_timeout": ".remoteresptout", "transport_type": ".transpsvctype",
        "end_to_end_flow_control": ".e2eflowctrl", "starting_psn": ".startpsn",
        "local_cm_response_timeout": ".localresptout", "retry_count": ".retrcount",
        "pkey": ".pkey", "path_mtu": ".pppmtu", "rdc_exists": ".rdcexist",
        "rnr_retry_count": ".rnrretrcount", "max_cm_retries": ".maxcmretr", "srq": ".srq",
        "extended_transport_type": ".ext_transport", "private_data": ".private",
        **{f"primary_{k}": f".prim_{v}" for k, v in _REQ_PATH.items()},
        **{f"alternate_{k}": f".alt_{v}" for k, v in _REQ_PATH.items()},
    }),
    cm.CmAttr.REP: ("infiniband.cm.rep", {
        "local_comm_id": "", "remote_comm_id": ".remotecommid", "local_qkey": ".localqkey",
        "local_qpn": ".localqpn", "local_eecn": ".localeecn", "starting_psn": ".startpsn",
        "responder_resources": ".respres", "initiator_depth": ".initdepth",
        "target_ack_delay": ".tgtackdelay", "failover_accepted": ".failoveracc",
        "end_to_end_flow_control": ".e2eflowctrl", "rnr_retry_count": ".rnrretrcount",
        "srq": ".srq", "local_ca_guid": ".localcaguid", "private_data": ".private",
    }),
    cm.CmAttr.RTU: ("infiniband.cm.rtu", {
        "local_comm_id": ".localcommid", "remote_comm_id": ".remotecommid",
        "private_data": ".private",
    }),
    cm.CmAttr.REJ: ("infiniband.cm.rej", {
        "local_comm_id": ".localcommid", "remote_comm_id": ".remotecommid",
        "message_rejected": ".msgrej", "reject_info_length": ".rejinfolen", "reason": ".reason",
        "ari": ".ari", "private_data": ".private",
    }),
    cm.CmAttr.DREQ: ("infiniband.cm.dreq", {
        "local_comm_id": ".localcommid", "remote_comm_id": ".remotecommid",
        "remote_qpn": "=infiniband.cm.req.remoteqpneecn", "private_data": ".private",
    }),
    cm.CmAttr.DREP: ("infiniband.cm.drsp", {
        "local_comm_id": ".localcommid", "remote_comm_id": ".remotecommid",
        "private_data": ".private",
    }),
}  # fmt: skip


def random_values(table: Table, rng: random.Random) -> dict[str, Value]:
    """Random legal values for every field (GIDs IPv4-mapped, as RoCE has them)."""
    out: dict[str, Value] = {}
    for p in table.values:
        f = p.field
        if f.kind is Kind.GID:
            out[f.name] = bytes(10) + b"\xff\xff" + rng.randbytes(4)
        elif f.kind is Kind.BYTES:
            out[f.name] = rng.randbytes(f.bits // 8)
        elif f.enum is not None:
            out[f.name] = int(rng.choice(list(f.enum)))
        else:
            out[f.name] = rng.getrandbits(f.bits)
    return out


def _as_int(show: str) -> int:
    m = re.search(r"\((\d+)\)\s*$", show)
    return int(m.group(1)) if m else int(show, 0)


def _shown(fields: dict[str, list[tuple[str, str]]], name: str) -> str:
    (hit,) = fields[name][:1]
    return hit[0]


def _check(fields: dict[str, list[tuple[str, str]]], attr: cm.CmAttr,
           vals: dict[str, Value]) -> int:  # fmt: skip
    base, names = NAMES[attr]
    table = cm.TABLES[attr]
    checked = 0
    for ours, theirs in names.items():
        name = theirs[1:] if theirs.startswith("=") else base + theirs
        f = table.by_name[ours].field
        v = vals[ours]
        if f.kind is Kind.GID:
            assert isinstance(v, bytes)
            if name + "_ipv4" in fields:
                want = str(ipaddress.IPv6Address(v).ipv4_mapped)
                assert _shown(fields, name + "_ipv4") == want, ours
            else:
                assert _shown(fields, name).replace(":", "") == v.hex(), ours
        elif f.kind is Kind.BYTES:
            assert isinstance(v, bytes)
            assert _shown(fields, name).replace(":", "") == v.hex(), ours
        elif ours.endswith("flow_label"):
            # Wireshark 4.0 reads the 20-bit flow label 8 bits short (roce-wire.md 4)
            assert _as_int(_shown(fields, name)) in (v, int(v) >> 8), ours
        else:
            assert _as_int(_shown(fields, name)) == int(v), (ours, _shown(fields, name), v)
        checked += 1
    return checked


def test_cm_messages_match_tshark(tmp_path: Path) -> None:
    rng = random.Random(2026)
    cases: list[tuple[cm.CmAttr, dict[str, Value]]] = []
    for _ in range(4):
        for attr in cm.TABLES:
            vals = random_values(cm.TABLES[attr], rng)
            if attr is cm.CmAttr.REQ:
                vals["service_id"] = int(vals["service_id"]) | 1 << 63  # not an IP CM ID
            cases.append((attr, vals))
    mads = [cm.cm_mad(a, rng.getrandbits(64), v) for a, v in cases]
    decoded = tshark_fields(mads, tmp_path)
    assert len(decoded) == len(mads)
    total = 0
    for (attr, vals), fields, mad in zip(cases, decoded, mads, strict=True):
        assert "_ws.malformed" not in fields and "_ws.expert" not in fields, attr
        assert _as_int(_shown(fields, "infiniband.mad.attributeid")) == attr
        assert _as_int(_shown(fields, "infiniband.mad.transactionid")) == cm.parse_cm(mad).tid
        if attr in NAMES:
            total += _check(fields, attr, vals)
    assert total == 4 * sum(len(n) for _, n in NAMES.values())  # every mapped field, 4 times


def test_rmpp_segment_headers_match_tshark(tmp_path: Path) -> None:
    """An SA GetTableResp sent with RMPP: tshark's RMPP header fields per segment."""
    hdr = bytes([1, 0x03, 2, 0x92, 0, 0, 0, 0]) + (0x42).to_bytes(8, "big")
    hdr += (0x0011).to_bytes(2, "big") + bytes(6)  # NodeRecord
    # printable records: the dissector reads them as NodeRecords with string fields
    s = RmppSender(header=hdr, data=b"A" * 800, class_header=bytes(20))
    segs = [s.segment(i) for i in range(1, s.count + 1)]
    decoded = tshark_fields(segs, tmp_path)
    for seg, fields in zip(segs, decoded, strict=True):
        h = RmppHeader.of(seg)
        assert "_ws.malformed" not in fields and "_ws.expert" not in fields
        assert _as_int(_shown(fields, "infiniband.rmpp.rmppversion")) == h.version == 1
        assert _as_int(_shown(fields, "infiniband.rmpp.rmpptype")) == h.type
        # Wireshark splits byte 26 as 4+4 bits (mask 0xF0), IBA and Linux as RRespTime 5 +
        # RMPPFlags 3: compare the byte the two spellings make
        shown = _as_int(_shown(fields, "infiniband.rmpp.rresptime")) << 4
        shown |= _as_int(_shown(fields, "infiniband.rmpp.rmppflags")) & 0xF
        assert shown == h.resp_time << 3 | h.flags
        assert _as_int(_shown(fields, "infiniband.rmpp.segmentnumber")) == h.segment_number
        assert _as_int(_shown(fields, "infiniband.rmpp.payloadlength")) == h.payload_length
