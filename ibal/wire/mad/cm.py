"""Communication Management messages (class 0x07, IBA vol.1 chapter 12) as field tables.

One :class:`~ibal.wire.fields.Table` per message describes the 232-byte MAD
data area (MAD bytes 24..255, offsets below count from byte 24).  Each ends
in its private data, whose size is fixed by the message: REQ 92, MRA 222,
REJ 148, REP 196, RTU 224, DREQ 220, DREP 224, LAP 168, APR 148, SIDR_REQ 216,
SIDR_REP 136 bytes.  :func:`cm_mad` and :func:`parse_cm` wrap them in a whole
256-byte MAD; the CM state machines (``ibal.cm``) use these and nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ibal.wire.fields import F, Field, FieldError, Kind, R, Table, Value
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import CLASS_VERSION, Method, MgmtClass
from ibal.wire.mad.consts import CmAttr as CmAttr  # one definition, re-exported with the tables

CM_CLASS = MgmtClass.COMM_MGT
CM_CLASS_VERSION = CLASS_VERSION[CM_CLASS]
MAD_DATA = H.data_size(CM_CLASS)  # 232: no class header


class TransportType(enum.IntEnum):
    RC = 0
    UC = 1
    RD = 2
    EXTENDED = 3


class MessageMraed(enum.IntEnum):
    """MRA's MessageMRAed and REJ's MessageRejected (REJ uses OTHER for 'no message')."""

    REQ = 0
    REP = 1
    LAP = 2  # MRA; in REJ the value 2 means "other"
    OTHER = 3  # reserved in MRA


class RejReason(enum.IntEnum):
    NO_QP = 1
    NO_EEC = 2
    NO_RESOURCES = 3
    TIMEOUT = 4
    UNSUPPORTED = 5
    INVALID_COMM_ID = 6
    INVALID_COMM_INSTANCE = 7
    INVALID_SERVICE_ID = 8
    INVALID_TRANSPORT_TYPE = 9
    STALE_CONN = 10
    RDC_NOT_EXIST = 11
    INVALID_GID = 12
    INVALID_LID = 13
    INVALID_SL = 14
    INVALID_TRAFFIC_CLASS = 15
    INVALID_HOP_LIMIT = 16
    INVALID_PACKET_RATE = 17
    INVALID_ALT_GID = 18
    INVALID_ALT_LID = 19
    INVALID_ALT_SL = 20
    INVALID_ALT_TRAFFIC_CLASS = 21
    INVALID_ALT_HOP_LIMIT = 22
    INVALID_ALT_PACKET_RATE = 23
    PORT_CM_REDIRECT = 24
    PORT_REDIRECT = 25
    INVALID_MTU = 26
    INSUFFICIENT_RESP_RESOURCES = 27
    CONSUMER_DEFINED = 28
    INVALID_RNR_RETRY = 29
    DUPLICATE_LOCAL_COMM_ID = 30
    INVALID_CLASS_VERSION = 31
    INVALID_FLOW_LABEL = 32
    INVALID_ALT_FLOW_LABEL = 33
    VENDOR_OPTION_NOT_SUPPORTED = 35


class AprStatus(enum.IntEnum):
    SUCCESS = 0
    INVALID_COMM_ID = 1
    UNSUPPORTED = 2
    REJECT = 3
    REDIRECT = 4
    IS_CURRENT = 5
    INVALID_QPN_EECN = 6
    INVALID_LID = 7
    INVALID_GID = 8
    INVALID_FLOW_LABEL = 9
    INVALID_TCLASS = 10
    INVALID_HOP_LIMIT = 11
    INVALID_PACKET_RATE = 12
    INVALID_SL = 13


class SidrStatus(enum.IntEnum):
    SUCCESS = 0
    UNSUPPORTED = 1  # service ID not supported
    REJECT = 2
    NO_QP = 3
    REDIRECT = 4
    UNSUPPORTED_VERSION = 5


def _path(prefix: str, at: int) -> list[Field]:
    """A REQ path (44 bytes) or the LAP's alternate path layout starting at byte ``at``."""
    return [
        F(f"{prefix}_local_lid", 16, offset=at * 8, hex=True),
        F(f"{prefix}_remote_lid", 16, hex=True),
        F(f"{prefix}_local_gid", 128, kind=Kind.GID),
        F(f"{prefix}_remote_gid", 128, kind=Kind.GID),
        F(f"{prefix}_flow_label", 20, hex=True),
        R(6),
        F(f"{prefix}_packet_rate", 6),
        F(f"{prefix}_traffic_class", 8),
        F(f"{prefix}_hop_limit", 8),
        F(f"{prefix}_sl", 4),
        F(f"{prefix}_subnet_local", 1, kind=Kind.BOOL),
        R(3),
        F(f"{prefix}_local_ack_timeout", 5),
    ]


def _priv(at: int) -> Field:
    return F("private_data", (MAD_DATA - at) * 8, kind=Kind.BYTES, offset=at * 8)


REQ = Table("CM REQ", [
    F("local_comm_id", 32, hex=True),
    R(8),
    F("vendor_id", 24, hex=True),
    F("service_id", 64, hex=True),
    F("local_ca_guid", 64, hex=True),
    R(32),
    F("local_qkey", 32, hex=True),
    F("local_qpn", 24, hex=True),
    F("responder_resources", 8),
    F("local_eecn", 24, hex=True),
    F("initiator_depth", 8),
    F("remote_eecn", 24, hex=True),
    F("remote_cm_response_timeout", 5),
    F("transport_type", 2, enum=TransportType),
    F("end_to_end_flow_control", 1, kind=Kind.BOOL),
    F("starting_psn", 24, hex=True),
    F("local_cm_response_timeout", 5),
    F("retry_count", 3),
    F("pkey", 16, hex=True),
    F("path_mtu", 4),
    F("rdc_exists", 1, kind=Kind.BOOL),
    F("rnr_retry_count", 3),
    F("max_cm_retries", 4),
    F("srq", 1, kind=Kind.BOOL),
    F("extended_transport_type", 3),
    *_path("primary", 52),
    R(3),
    *_path("alternate", 96),
    F("sap_supported", 1, kind=Kind.BOOL),
    R(2),
    _priv(140),
], size=MAD_DATA)  # fmt: skip

MRA = Table("CM MRA", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    F("message_mraed", 2, enum=MessageMraed),
    R(6),
    F("service_timeout", 5),
    R(3),
    _priv(10),
], size=MAD_DATA)  # fmt: skip

REJ = Table("CM REJ", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    F("message_rejected", 2, enum=MessageMraed),
    R(6),
    F("reject_info_length", 7),
    R(1),
    F("reason", 16, enum=RejReason),
    F("ari", 72 * 8, kind=Kind.BYTES),
    _priv(84),
], size=MAD_DATA)  # fmt: skip

REP = Table("CM REP", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    F("local_qkey", 32, hex=True),
    F("local_qpn", 24, hex=True),
    F("vendor_id_h", 8, hex=True),
    F("local_eecn", 24, hex=True),
    F("vendor_id_m", 8, hex=True),
    F("starting_psn", 24, hex=True),
    F("vendor_id_l", 8, hex=True),
    F("responder_resources", 8),
    F("initiator_depth", 8),
    F("target_ack_delay", 5),
    F("failover_accepted", 2),
    F("end_to_end_flow_control", 1, kind=Kind.BOOL),
    F("rnr_retry_count", 3),
    F("srq", 1, kind=Kind.BOOL),
    R(4),
    F("local_ca_guid", 64, hex=True),
    _priv(36),
], size=MAD_DATA)  # fmt: skip

RTU = Table("CM RTU", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    _priv(8),
], size=MAD_DATA)  # fmt: skip

DREQ = Table("CM DREQ", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    F("remote_qpn", 24, hex=True),
    R(8),
    _priv(12),
], size=MAD_DATA)  # fmt: skip

DREP = Table("CM DREP", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    _priv(8),
], size=MAD_DATA)  # fmt: skip

LAP = Table("CM LAP", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    R(32),
    F("remote_qpn", 24, hex=True),
    F("remote_cm_response_timeout", 5),
    R(3),
    R(32),
    F("alternate_local_lid", 16, hex=True),
    F("alternate_remote_lid", 16, hex=True),
    F("alternate_local_gid", 128, kind=Kind.GID),
    F("alternate_remote_gid", 128, kind=Kind.GID),
    F("alternate_flow_label", 20, hex=True),
    R(4),
    F("alternate_traffic_class", 8),
    F("alternate_hop_limit", 8),
    R(2),
    F("alternate_packet_rate", 6),
    F("alternate_sl", 4),
    F("alternate_subnet_local", 1, kind=Kind.BOOL),
    R(3),
    F("alternate_local_ack_timeout", 5),
    R(3),
    _priv(64),
], size=MAD_DATA)  # fmt: skip

APR = Table("CM APR", [
    F("local_comm_id", 32, hex=True),
    F("remote_comm_id", 32, hex=True),
    F("additional_info_length", 8),
    F("status", 8, enum=AprStatus),
    R(16),
    F("additional_info", 72 * 8, kind=Kind.BYTES),
    _priv(84),
], size=MAD_DATA)  # fmt: skip

SIDR_REQ = Table("CM SIDR_REQ", [
    F("request_id", 32, hex=True),
    F("pkey", 16, hex=True),
    R(16),
    F("service_id", 64, hex=True),
    _priv(16),
], size=MAD_DATA)  # fmt: skip

SIDR_REP = Table("CM SIDR_REP", [
    F("request_id", 32, hex=True),
    F("status", 8, enum=SidrStatus),
    F("additional_info_length", 8),
    F("vendor_id_h", 16, hex=True),
    F("qpn", 24, hex=True),
    F("vendor_id_l", 8, hex=True),
    F("service_id", 64, hex=True),
    F("qkey", 32, hex=True),
    F("additional_info", 72 * 8, kind=Kind.BYTES),
    _priv(96),
], size=MAD_DATA)  # fmt: skip

TABLES: dict[CmAttr, Table] = {
    CmAttr.REQ: REQ, CmAttr.MRA: MRA, CmAttr.REJ: REJ, CmAttr.REP: REP, CmAttr.RTU: RTU,
    CmAttr.DREQ: DREQ, CmAttr.DREP: DREP, CmAttr.LAP: LAP, CmAttr.APR: APR,
    CmAttr.SIDR_REQ: SIDR_REQ, CmAttr.SIDR_REP: SIDR_REP,
}  # fmt: skip

PRIVATE_DATA_SIZE: dict[CmAttr, int] = {
    a: t.by_name["private_data"].field.bits // 8 for a, t in TABLES.items()
}


@dataclass(frozen=True, slots=True)
class CmMessage:
    """A decoded CM MAD: which message, its TID, and its fields by name."""

    attr: CmAttr
    tid: int
    fields: dict[str, Value]


def cm_mad(attr: CmAttr, tid: int, values: dict[str, Value] | None = None, **kw: Value) -> bytes:
    """A 256-byte CM MAD (method Send) carrying ``attr`` with ``values``; checked.

    ``private_data`` may be shorter than the message's size: it is zero-padded.
    """
    table = TABLES[CmAttr(attr)]
    vals = dict(values or {}, **kw)
    pd = vals.get("private_data")
    size = PRIVATE_DATA_SIZE[attr]
    if isinstance(pd, bytes | bytearray):
        if len(pd) > size:
            raise FieldError("range", f"{table.name}: private data is at most {size} bytes",
                             "private_data")  # fmt: skip
        vals["private_data"] = bytes(pd) + bytes(size - len(pd))
    return bytes(H.build(CM_CLASS, Method.SEND, attr, tid=tid, data=table.encode(vals)))


def parse_cm(mad: bytes | bytearray | memoryview) -> CmMessage:
    """Decode a CM MAD; raises ``FieldError`` for a short MAD, another class or attribute."""
    h = H.header_of(mad, CM_CLASS, "CM")
    try:
        attr = CmAttr(h.attr_id)
        table = TABLES[attr]
    except (ValueError, KeyError):
        raise FieldError("enum", f"CM attribute {h.attr_id:#06x} is not a CM message") from None
    return CmMessage(attr, h.tid, table.decode(mad, H.data_offset(CM_CLASS)))
