"""Pure conversions between the CM records and the CM messages on the wire.

- ``build_*``: a request record plus the local facts the CM knows (comm IDs,
  CA GUID, QPN, PSN, the CA's ACK delay) -> the 232-byte MAD data area of the
  message, through the field tables of :mod:`ibal.wire.mad.cm` (:func:`mad` wraps it
  in a 256-byte MAD with a TID);
- ``*_rec`` / :func:`to_rec`: decoded message fields -> the IBAL record the
  callback gets (handles and contexts left for the CM to fill);
- :func:`req_path_fields` / :func:`path_from_req`: a PathRecord -> a REQ's
  primary or alternate path, and back as the receiving side sees it;
- :func:`passive_mods` / :func:`active_mods` / :func:`alt_path_mod`: the
  ``QpMod`` s that take the QP to INIT, RTR and RTS (and load an alternate
  path), derived with :mod:`ibal.al.connect` from the REQ and the REP;
- timers: :func:`cm_convert_to_ms`, :func:`cm_ack_timeout`,
  :func:`retransmit_timeout_ms`, :func:`mra_timeout_ms`, :func:`timewait_ms`
  (roce-wire.md 3.5, as Linux's ``cm.c`` computes them).

Nothing here does I/O or keeps state.  Bad records raise the statuses of
:mod:`ibal.cm.records`; a peer's message the tables accept always converts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from ipaddress import IPv6Address
from typing import Any, Final, NamedTuple

from ibal.al import ConnectOptions, Endpoint, path_to, transitions
from ibal.cm.records import (
    ARI_SIZE,
    CmApr,
    CmAprRec,
    CmDrep,
    CmDrepRec,
    CmDreq,
    CmDreqRec,
    CmFailover,
    CmLap,
    CmLapRec,
    CmMra,
    CmMraRec,
    CmRej,
    CmRejRec,
    CmRep,
    CmRepRec,
    CmReq,
    CmReqRec,
    CmRtu,
    CmRtuRec,
    PathRec,
    check_path,
    check_pdata,
)
from ibal.status import InvalidParameter, InvalidSetting
from ibal.types import (
    PERMISSIVE_LID,
    AccessFlags,
    ApmState,
    AvAttr,
    Gid,
    GidType,
    LinkLayer,
    Mtu,
    PortAttr,
    QpMod,
    QpState,
    QpType,
)
from ibal.wire.fields import FieldError, Value
from ibal.wire.mad import header as H
from ibal.wire.mad.cm import (
    CM_CLASS,
    MAD_DATA,
    TABLES,
    AprStatus,
    CmAttr,
    MessageMraed,
    RejReason,
    SidrStatus,
    TransportType,
)
from ibal.wire.mad.consts import Method

__all__ = [
    "MAD_DATA",
    "ConnectMods",
    "PathMismatch",
    "active_mods",
    "alt_path_mod",
    "apr_rec",
    "av_from_path",
    "build_apr",
    "build_drep",
    "build_dreq",
    "build_lap",
    "build_mra",
    "build_rej",
    "build_rep",
    "build_req",
    "build_rtu",
    "build_sidr_rep",
    "build_sidr_req",
    "check_pdata",
    "check_req",
    "cm_ack_timeout",
    "cm_convert_to_ms",
    "drep_rec",
    "dreq_rec",
    "has_alternate",
    "lap_path_fields",
    "lap_rec",
    "mad",
    "mra_rec",
    "mra_timeout_ms",
    "parse",
    "passive_mods",
    "path_from_lap",
    "path_from_req",
    "qp_type_of",
    "rej_rec",
    "rep_message",
    "rep_rec",
    "req_message",
    "req_path_fields",
    "req_rec",
    "retransmit_timeout_ms",
    "rtu_rec",
    "sidr_rep_rec",
    "sidr_req_rec",
    "timewait_ms",
    "to_rec",
]  # fmt: skip

Fields = Mapping[str, Value]

# ------------------------------------------------------------------ timers


def cm_convert_to_ms(t: int) -> int:
    """4.096 µs * 2^t in whole ms, as Linux approximates it: ``1 << max(t - 8, 0)``."""
    return 1 << max(int(t) - 8, 0)


def cm_ack_timeout(ca_ack_delay: int, packet_life: int) -> int:
    """The QP's local ACK timeout for a path: about 2 * packet life + the target's ACK
    delay (IBA 12.7.34), in the 5-bit encoding, capped at 31 (Linux ``cm_ack_timeout``)."""
    ack = packet_life + 1
    if ack >= ca_ack_delay:
        ack += ca_ack_delay >= ack - 1
    else:
        ack = ca_ack_delay + (ack >= ca_ack_delay - 1)
    return min(31, ack)


def retransmit_timeout_ms(packet_life: int, response_timeout: int) -> int:
    """How long to wait for the answer to a REQ/REP/DREQ/LAP before sending it again:
    2 * ms(packet life) + ms(the peer's CM response timeout)."""
    return 2 * cm_convert_to_ms(packet_life) + cm_convert_to_ms(response_timeout)


def mra_timeout_ms(service_timeout: int, ack_timeout: int) -> int:
    """The stretched wait after an MRA: ms(its service timeout) + ms(the path's ACK
    timeout) (Linux ``cm_mra_handler``)."""
    return cm_convert_to_ms(service_timeout) + cm_convert_to_ms(ack_timeout)


def sidr_timeout_ms(timeout_ms: int, packet_life: int) -> int:
    """A SIDR_REQ's wait: the request's ``timeout_ms`` + 2 * ms(packet life) (the seed's
    ``ib_cm_req_t.timeout_ms`` rule)."""
    return timeout_ms + 2 * cm_convert_to_ms(packet_life)


def timewait_ms(ack_timeout: int) -> int:
    """TIMEWAIT's length: ms(the path's local ACK timeout) (Linux ``cm_enter_timewait``)."""
    return cm_convert_to_ms(ack_timeout)


# ------------------------------------------------------------------ framing


def mad(attr: CmAttr, tid: int, data: bytes) -> bytes:
    """The 256-byte CM MAD (method Send) carrying the 232-byte ``data`` of ``attr``."""
    if len(data) != MAD_DATA:
        raise InvalidParameter(f"CM data is {MAD_DATA} bytes, not {len(data)}")
    return bytes(H.build(CM_CLASS, Method.SEND, CmAttr(attr), tid=tid, data=data))


def parse(attr: CmAttr, data: bytes | bytearray | memoryview) -> dict[str, Value]:
    """The fields of ``attr``'s 232-byte data area; ``FieldError`` when it is short."""
    return TABLES[CmAttr(attr)].decode(data)


def _encode(attr: CmAttr, values: dict[str, Value]) -> bytes:
    return _encode_decoded(attr, values)[0]


def _encode_decoded(attr: CmAttr, values: dict[str, Value]) -> tuple[bytes, Fields]:
    """The message's bytes and its fields as :func:`parse` would read them back."""
    table = TABLES[attr]
    pd = values.get("private_data", b"")
    assert isinstance(pd, bytes)
    values["private_data"] = pd + bytes(table.by_name["private_data"].field.bits // 8 - len(pd))
    try:
        return table.encode_decoded(values)
    except FieldError as exc:  # a local fact out of range: the caller's setting
        raise InvalidSetting(f"{attr.name}: {exc}") from None


def _gid_bytes(v: Any) -> bytes:
    return bytes(getattr(v, "packed", v))


# ------------------------------------------------------------------ paths

_PERMISSIVE: Final = PERMISSIVE_LID


def req_path_fields(path: PathRec | None, prefix: str, *, ca_ack_delay: int,
                    checked: bool = False) -> dict[str, Value]:  # fmt: skip
    """A REQ's ``primary_*`` or ``alternate_*`` fields (``prefix``) from a PathRecord
    whose ``sgid`` is this side's; all zero for ``None`` (no alternate path).

    Beyond one hop (``hop_limit`` > 1: RoCE, routed IB) the LIDs are the
    permissive 0xFFFF and SubnetLocal 0 (Linux ``cm_format_req``, roce-wire.md 3.4);
    the local ACK timeout is :func:`cm_ack_timeout` of this CA's ACK delay.
    """
    p = f"{prefix}_"
    if path is None:
        return {}
    if not checked:
        path = check_path(f"{prefix} path", path)
    local = int(path["hop_limit"]) <= 1
    return {
        p + "local_lid": int(path["slid"]) if local else _PERMISSIVE,
        p + "remote_lid": int(path["dlid"]) if local else _PERMISSIVE,
        p + "local_gid": _gid_bytes(path["sgid"]),
        p + "remote_gid": _gid_bytes(path["dgid"]),
        p + "flow_label": path["flow_label"],
        p + "packet_rate": path["rate"],
        p + "traffic_class": path["tclass"],
        p + "hop_limit": path["hop_limit"],
        p + "sl": path["sl"],
        p + "subnet_local": local,
        p + "local_ack_timeout": cm_ack_timeout(ca_ack_delay, int(path["packet_life_time"])),
    }


def lap_path_fields(path: PathRec, *, ca_ack_delay: int) -> dict[str, Value]:
    """A LAP's ``alternate_*`` fields: the REQ layout's names (same rules)."""
    return req_path_fields(path, "alternate", ca_ack_delay=ca_ack_delay)


def has_alternate(fields: Fields, prefix: str = "alternate") -> bool:
    """Whether a REQ (or LAP) carries an alternate path (a GID or LID is set)."""
    return bool(
        fields[f"{prefix}_local_lid"] or fields[f"{prefix}_remote_lid"]
        or any(_gid_bytes(fields[f"{prefix}_local_gid"]))
    )  # fmt: skip


def _path_record(fields: Fields, prefix: str, *, receiver: bool, pkey: int, mtu: int,
                 service_id: int) -> dict[str, Value]:  # fmt: skip
    loc, rem = ("remote", "local") if receiver else ("local", "remote")
    life = int(fields[f"{prefix}_local_ack_timeout"])
    return {
        "service_id": service_id,
        "dgid": _gid_bytes(fields[f"{prefix}_{rem}_gid"]),
        "sgid": _gid_bytes(fields[f"{prefix}_{loc}_gid"]),
        "dlid": fields[f"{prefix}_{rem}_lid"],
        "slid": fields[f"{prefix}_{loc}_lid"],
        "raw_traffic": 0,
        "flow_label": fields[f"{prefix}_flow_label"],
        "hop_limit": fields[f"{prefix}_hop_limit"],
        "tclass": fields[f"{prefix}_traffic_class"],
        "reversible": 1,
        "numb_path": 0,
        "p_key": pkey,
        "qos_class": 0,
        "sl": fields[f"{prefix}_sl"],
        "mtu_selector": 2,
        "mtu": mtu,
        "rate_selector": 2,
        "rate": fields[f"{prefix}_packet_rate"],
        "packet_life_time_selector": 2,
        # the REQ carries only the ACK timeout, ~ life + 1 (Linux cm_format_path_from_req)
        "packet_life_time": max(life - 1, 0),
        "preference": 0,
    }


def path_from_req(
    req: Fields, prefix: str = "primary", *, passive: bool = True
) -> dict[str, Value]:
    """The PathRecord (``ibal.wire.mad.sa.PATH_RECORD`` names) of a REQ's primary or
    alternate path, ``sgid`` being the passive side's GID (``passive``) or the
    active side's.  ``packet_life_time`` is the REQ's local ACK timeout - 1."""
    return _path_record(req, prefix, receiver=passive, pkey=int(req["pkey"]),
                        mtu=int(req["path_mtu"]), service_id=int(req["service_id"]))  # fmt: skip


def path_from_lap(lap: Fields, *, pkey: int, mtu: int, receiver: bool = True) -> dict[str, Value]:
    """The alternate PathRecord a LAP proposes, seen by its receiver (or its sender);
    P_Key and MTU are the connection's (a LAP carries neither)."""
    return _path_record(lap, "alternate", receiver=receiver, pkey=pkey, mtu=mtu, service_id=0)


class PathMismatch(InvalidSetting):
    """A REQ (or a path) this port cannot accept: ``reason`` is the REJ reason to answer
    with (``INVALID_GID``, ``INVALID_ALT_GID``, ``INVALID_MTU``, ``INVALID_TRANSPORT_TYPE``)."""

    def __init__(self, message: str, reason: RejReason) -> None:
        super().__init__(message)
        self.reason = reason


def _sgid_index(port: PortAttr, sgid: bytes, alt: bool) -> int:
    same = [e for e in port.gid_table if e.gid.packed == sgid]
    if same:  # RoCE lists a GID once per type: v2 is what the peers' CMs use
        return min(same, key=lambda e: (e.gid_type is not GidType.ROCE_V2, e.index)).index
    why = RejReason.INVALID_ALT_GID if alt else RejReason.INVALID_GID
    a6 = IPv6Address(sgid)
    shown = f"::ffff:{a6.ipv4_mapped}" if a6.ipv4_mapped else str(a6)
    raise PathMismatch(f"GID {shown} is not a GID of port {port.port_num}", why)


def _endpoint_options(path: PathRec, port: PortAttr, *, alt: bool = False,
                      checked: bool = False) -> tuple[Endpoint, ConnectOptions]:  # fmt: skip
    """``ibal.al.connect``'s view of a path: the far end and the addressing options
    (``checked``: a path :func:`path_from_req` made of a message's fields, whose widths
    the table bounds, is not checked again)."""
    if not checked:
        path = check_path("path", path)
    roce = port.link_layer is LinkLayer.ETHERNET
    dgid = _gid_bytes(path["dgid"])
    dlid = int(path["dlid"])
    if roce or dlid == _PERMISSIVE:
        dlid = 0  # RoCE (and routed) paths: the CM writes the permissive LID; AVs use the GID
    hop = int(path["hop_limit"])
    want_grh = roce or hop > 0
    opts = ConnectOptions(
        sl=int(path["sl"]),
        grh=want_grh,
        sgid_index=_sgid_index(port, _gid_bytes(path["sgid"]), alt) if want_grh else None,
        hop_limit=hop,
        traffic_class=int(path["tclass"]),
        flow_label=int(path["flow_label"]),
    )
    gid = Gid(dgid) if any(dgid) or want_grh else None
    return Endpoint(qpn=0, lid=dlid, gid=gid, mtu=Mtu(int(path["mtu"]))), opts


def av_from_path(path: PathRec, port: PortAttr, *, alt: bool = False) -> AvAttr:
    """The address vector a PathRecord (``sgid`` local) gives on ``port``, built by
    :func:`ibal.al.connect.path_to`.  ``PathMismatch`` when ``sgid`` is not the port's."""
    ep, opts = _endpoint_options(path, port, alt=alt)
    return path_to(port, ep, opts)


def check_req(req: Fields, port: PortAttr, *, alt_port: PortAttr | None = None) -> None:
    """Whether the passive side can take the REQ ``req`` on ``port``; else
    :class:`PathMismatch` with the reason a REJ should carry.

    The transport must be RC or UC, the path MTU an IB MTU code, and each path's
    GID on this side one of the port's (the alternate's on ``alt_port``).
    """
    qp_type_of(req)
    mtu = int(req["path_mtu"])
    if not 1 <= mtu <= 5:
        raise PathMismatch(f"path MTU code {mtu} is not an IB MTU (1..5)", RejReason.INVALID_MTU)
    _sgid_index(port, _gid_bytes(req["primary_remote_gid"]), False)
    if has_alternate(req):
        _sgid_index(alt_port or port, _gid_bytes(req["alternate_remote_gid"]), True)


# ------------------------------------------------------------------ QP attributes


class ConnectMods(NamedTuple):
    """The three modifies that connect a QP: RESET -> INIT -> RTR -> RTS."""

    init: QpMod
    rtr: QpMod
    rts: QpMod

    def for_state(self, target: QpState) -> QpMod:
        """The modify to ``target`` (INIT, RTR or RTS: what the fsm's ``ModifyQp`` names)."""
        for m in self:
            if m.state is target:
                return m
        raise InvalidParameter(f"the CM connects a QP to INIT, RTR and RTS, not {target.name}")


def qp_type_of(req: Fields) -> QpType:
    """The QP type a REQ's transport type asks for; :class:`PathMismatch`
    (``INVALID_TRANSPORT_TYPE``) for RD and extended transports."""
    t = int(req["transport_type"])
    if t == TransportType.RC:
        return QpType.RC
    if t == TransportType.UC:
        return QpType.UC
    raise PathMismatch(f"transport type {t} is not supported (RC and UC only)",
                       RejReason.INVALID_TRANSPORT_TYPE)  # fmt: skip


def _mods(req: Fields, *, path: PathRec, alt_path: PathRec | None, port: PortAttr,
          alt_port: PortAttr | None, pkey_index: int, access: AccessFlags, remote_qpn: int,
          rq_psn: int, sq_psn: int, resp_res: int, init_depth: int, ack_timeout: int,
          rnr_retry: int, rnr_nak_timeout: int) -> ConnectMods:  # fmt: skip
    ep, opts = _endpoint_options(path, port, checked=True)
    ep = replace(ep, qpn=remote_qpn, psn=rq_psn)  # connect's "remote psn" is the receive PSN
    opts = replace(
        opts, access=access, pkey_index=pkey_index, local_ack_timeout=ack_timeout,
        retry_cnt=int(req["retry_count"]), rnr_retry_cnt=rnr_retry,
        rnr_nak_timeout=rnr_nak_timeout, resp_res=resp_res, init_depth=init_depth,
    )  # fmt: skip
    init, rtr, rts = transitions(qp_type_of(req), port, ep, psn=sq_psn, options=opts)
    if alt_path is not None:
        rtr = replace(rtr, alternate_av=av_from_path(alt_path, alt_port or port, alt=True))
        rts = replace(rts, apm_state=ApmState.REARM)
    return ConnectMods(init, rtr, rts)


def passive_mods(req: Fields, rep: Fields, *, port: PortAttr, pkey_index: int,
                 access: AccessFlags, rnr_nak_timeout: int = 12,
                 alt_port: PortAttr | None = None) -> ConnectMods:  # fmt: skip
    """The passive side's modifies, from the REQ it got and the REP it sends.

    A message's starting PSN is the PSN its sender receives first (Linux ``cm.c``:
    the passive side sends from the REQ's, receives from its own REP's); the
    destination QPN is the REQ's; responder resources (RTR) and initiator depth
    (RTS) are the REP's; the ACK timeout is the REQ's local ACK timeout (the
    requester computed it with its own ACK delay); retry and RNR retry counts
    are the REQ's; ``rnr_nak_timeout`` is ``CmRep.rnr_nak_timeout``.  An
    alternate path in the REQ becomes ``alternate_av`` (RTR) and ``apm_state``
    REARM (RTS).
    """
    alt = path_from_req(req, "alternate") if has_alternate(req) else None
    return _mods(
        req, path=path_from_req(req), alt_path=alt, port=port, alt_port=alt_port,
        pkey_index=pkey_index, access=access, remote_qpn=int(req["local_qpn"]),
        rq_psn=int(rep["starting_psn"]), sq_psn=int(req["starting_psn"]),
        resp_res=int(rep["responder_resources"]), init_depth=int(rep["initiator_depth"]),
        ack_timeout=int(req["primary_local_ack_timeout"]),
        rnr_retry=int(req["rnr_retry_count"]), rnr_nak_timeout=rnr_nak_timeout,
    )  # fmt: skip


def active_mods(req: Fields, rep: Fields, *, port: PortAttr, pkey_index: int,
                access: AccessFlags, rnr_nak_timeout: int = 12, packet_life: int | None = None,
                alt_port: PortAttr | None = None) -> ConnectMods:  # fmt: skip
    """The active side's modifies, from the REQ it sent and the REP it got.

    The REP's initiator depth becomes this QP's responder resources and its
    responder resources this QP's initiator depth (the swap; never above what the
    REQ offered); the destination
    QPN is the REP's; the QP receives from the REQ's starting PSN and sends from
    the REP's; the ACK timeout is :func:`cm_ack_timeout` of the REP's target ACK
    delay and ``packet_life`` (the primary PathRecord's; ``None``: the REQ's ACK
    timeout - 1); the RNR retry count is the REP's, the retry count the REQ's.
    """
    path = path_from_req(req, passive=False)
    life = int(path["packet_life_time"]) if packet_life is None else packet_life
    alt = path_from_req(req, "alternate", passive=False) if has_alternate(req) else None
    return _mods(
        req, path=path, alt_path=alt, port=port, alt_port=alt_port, pkey_index=pkey_index,
        access=access, remote_qpn=int(rep["local_qpn"]), rq_psn=int(req["starting_psn"]),
        sq_psn=int(rep["starting_psn"]),
        # the REP may lower what the REQ offered, never raise it (a peer's REP is checked
        # nowhere else)
        resp_res=min(int(rep["initiator_depth"]), int(req["responder_resources"])),
        init_depth=min(int(rep["responder_resources"]), int(req["initiator_depth"])),
        ack_timeout=cm_ack_timeout(int(rep["target_ack_delay"]), life),
        rnr_retry=int(rep["rnr_retry_count"]), rnr_nak_timeout=rnr_nak_timeout,
    )  # fmt: skip


def alt_path_mod(path: PathRec, port: PortAttr) -> QpMod:
    """RTS -> RTS loading ``path`` (``sgid`` local) as the alternate path, re-armed:
    what a LAP's sender does on an accepting APR and its receiver before accepting."""
    return QpMod(QpState.RTS, alternate_av=av_from_path(path, port, alt=True),
                 apm_state=ApmState.REARM)  # fmt: skip


# ------------------------------------------------------------------ build


def build_req(req: CmReq, *, local_comm_id: int, local_ca_guid: int, local_qpn: int,
              starting_psn: int, ca_ack_delay: int, srq: bool = False,
              local_qkey: int = 0, checked: bool = False) -> bytes:  # fmt: skip
    """A REQ's 232 bytes from an RC/UC :class:`CmReq` (validated here unless ``checked``:
    the caller did) and local facts.

    P_Key and path MTU are the primary path's; ``ca_ack_delay`` (this CA's, IBA
    ``LocalCADelay``) enters each path's local ACK timeout.
    """
    return req_message(req, local_comm_id=local_comm_id, local_ca_guid=local_ca_guid,
                       local_qpn=local_qpn, starting_psn=starting_psn,
                       ca_ack_delay=ca_ack_delay, srq=srq, local_qkey=local_qkey,
                       checked=checked)[0]  # fmt: skip


def req_message(req: CmReq, *, local_comm_id: int, local_ca_guid: int, local_qpn: int,
                starting_psn: int, ca_ack_delay: int, srq: bool = False, local_qkey: int = 0,
                checked: bool = False, paths: tuple[PathRec, PathRec | None] | None = None,
                ) -> tuple[bytes, Fields]:  # fmt: skip
    """:func:`build_req`'s bytes and the fields :func:`parse` would read from them.
    ``paths``: the primary and alternate path as :func:`~ibal.cm.records.check_path`
    gave them to a ``checked`` caller (not checked again)."""
    if not checked:
        req.validate()
    if req.qp_type is QpType.UD:
        raise InvalidParameter("a UD request is a SIDR_REQ: use build_sidr_req")
    assert req.primary_path is not None
    pri: PathRec
    alt: PathRec | None
    if paths is None:
        pri = check_path("primary_path", req.primary_path)
        alt = None if req.alt_path is None else check_path("alt_path", req.alt_path)
    else:
        pri, alt = paths
    values: dict[str, Value] = {
        "local_comm_id": local_comm_id,
        "service_id": req.svc_id,
        "local_ca_guid": local_ca_guid,
        "local_qkey": local_qkey,
        "local_qpn": local_qpn,
        "responder_resources": req.resp_res,
        "initiator_depth": req.init_depth,
        "remote_cm_response_timeout": req.remote_resp_timeout,
        "transport_type": TransportType.UC if req.qp_type is QpType.UC else TransportType.RC,
        "end_to_end_flow_control": bool(req.flow_ctrl),
        "starting_psn": starting_psn,
        "local_cm_response_timeout": req.local_resp_timeout,
        "retry_count": req.retry_cnt,
        "pkey": int(pri["p_key"]),
        "path_mtu": int(pri["mtu"]),
        "rnr_retry_count": req.rnr_retry_cnt,
        "max_cm_retries": req.max_cm_retries,
        "srq": srq,
        **req_path_fields(pri, "primary", ca_ack_delay=ca_ack_delay, checked=True),
        **req_path_fields(alt, "alternate", ca_ack_delay=ca_ack_delay, checked=True),
        "private_data": bytes(req.pdata),
    }
    return _encode_decoded(CmAttr.REQ, values)


def build_rep(rep: CmRep, *, req: Fields, local_comm_id: int, local_ca_guid: int,
              local_qpn: int, starting_psn: int, resp_res: int | None = None,
              ca_ack_delay: int = 0, srq: bool = False, local_qkey: int = 0) -> bytes:  # fmt: skip
    """A REP's 232 bytes answering the REQ ``req`` (its decoded fields).

    ``resp_res`` (this QP's responder resources) defaults to the REQ's
    initiator depth; ``rep.init_depth`` may not pass the REQ's responder
    resources (``InvalidSetting``).  TargetACKDelay is ``rep.target_ack_delay``,
    or when that is 0 this CA's ``ca_ack_delay`` (what Linux always sends).
    """
    return rep_message(rep, req=req, local_comm_id=local_comm_id, local_ca_guid=local_ca_guid,
                       local_qpn=local_qpn, starting_psn=starting_psn, resp_res=resp_res,
                       ca_ack_delay=ca_ack_delay, srq=srq, local_qkey=local_qkey)[0]  # fmt: skip


def rep_message(rep: CmRep, *, req: Fields, local_comm_id: int, local_ca_guid: int,
                local_qpn: int, starting_psn: int, resp_res: int | None = None,
                ca_ack_delay: int = 0, srq: bool = False, local_qkey: int = 0,
                checked: bool = False) -> tuple[bytes, Fields]:  # fmt: skip
    """:func:`build_rep`'s bytes and the fields :func:`parse` would read from them
    (``checked``: the caller validated ``rep`` against the REQ already)."""
    if not checked:
        rep.validate(req_rec(req))
    if rep.qp_type is QpType.UD:
        raise InvalidParameter("a UD reply is a SIDR_REP: use build_sidr_rep")
    rr = int(req["initiator_depth"]) if resp_res is None else resp_res
    values: dict[str, Value] = {
        "local_comm_id": local_comm_id,
        "remote_comm_id": req["local_comm_id"],
        "local_qkey": local_qkey,
        "local_qpn": local_qpn,
        "starting_psn": starting_psn,
        "responder_resources": rr,
        "initiator_depth": rep.init_depth,
        "target_ack_delay": rep.target_ack_delay or ca_ack_delay,
        "failover_accepted": int(rep.failover_accepted),
        "end_to_end_flow_control": bool(rep.flow_ctrl),
        "rnr_retry_count": rep.rnr_retry_cnt,
        "srq": srq,
        "local_ca_guid": local_ca_guid,
        "private_data": bytes(rep.pdata),
    }
    return _encode_decoded(CmAttr.REP, values)


def build_rtu(rtu: CmRtu, *, local_comm_id: int, remote_comm_id: int,
              checked: bool = False) -> bytes:  # fmt: skip
    """An RTU's 232 bytes (``rtu`` validated here unless ``checked``)."""
    if not checked:
        rtu.validate()
    return _encode(CmAttr.RTU, {"local_comm_id": local_comm_id,
                                "remote_comm_id": remote_comm_id,
                                "private_data": bytes(rtu.pdata)})  # fmt: skip


def build_rej(rej: CmRej, *, local_comm_id: int, remote_comm_id: int,
              rejected: MessageMraed) -> bytes:  # fmt: skip
    """A REJ's 232 bytes; ``rejected`` says which message (REQ, REP, or OTHER)."""
    rej.validate()
    ari = bytes(rej.ari)
    return _encode(CmAttr.REJ, {
        "local_comm_id": local_comm_id, "remote_comm_id": remote_comm_id,
        "message_rejected": rejected, "reject_info_length": len(ari),
        "reason": int(rej.rej_status), "ari": ari + bytes(ARI_SIZE - len(ari)),
        "private_data": bytes(rej.pdata),
    })  # fmt: skip


def build_mra(mra: CmMra, *, local_comm_id: int, remote_comm_id: int,
              mraed: MessageMraed) -> bytes:  # fmt: skip
    """An MRA's 232 bytes; ``mraed`` says which message it acknowledges (REQ, REP, LAP)."""
    mra.validate()
    if mraed not in (MessageMraed.REQ, MessageMraed.REP, MessageMraed.LAP):
        raise InvalidParameter(f"an MRA acknowledges a REQ, REP or LAP, not {mraed!r}")
    return _encode(CmAttr.MRA, {
        "local_comm_id": local_comm_id, "remote_comm_id": remote_comm_id,
        "message_mraed": mraed, "service_timeout": mra.svc_timeout,
        "private_data": bytes(mra.pdata),
    })  # fmt: skip


def build_dreq(dreq: CmDreq, *, local_comm_id: int, remote_comm_id: int,
               remote_qpn: int) -> bytes:  # fmt: skip
    """A DREQ's 232 bytes (``remote_qpn``: the peer's QP)."""
    dreq.validate()
    return _encode(CmAttr.DREQ, {"local_comm_id": local_comm_id,
                                 "remote_comm_id": remote_comm_id, "remote_qpn": remote_qpn,
                                 "private_data": bytes(dreq.pdata)})  # fmt: skip


def build_drep(drep: CmDrep, *, local_comm_id: int, remote_comm_id: int) -> bytes:
    """A DREP's 232 bytes."""
    drep.validate()
    return _encode(CmAttr.DREP, {"local_comm_id": local_comm_id,
                                 "remote_comm_id": remote_comm_id,
                                 "private_data": bytes(drep.pdata)})  # fmt: skip


def build_lap(lap: CmLap, *, local_comm_id: int, remote_comm_id: int, remote_qpn: int,
              ca_ack_delay: int) -> bytes:  # fmt: skip
    """A LAP's 232 bytes proposing ``lap.alt_path`` (``sgid`` local)."""
    lap.validate()
    assert lap.alt_path is not None
    return _encode(CmAttr.LAP, {
        "local_comm_id": local_comm_id, "remote_comm_id": remote_comm_id,
        "remote_qpn": remote_qpn, "remote_cm_response_timeout": lap.remote_resp_timeout,
        **lap_path_fields(lap.alt_path, ca_ack_delay=ca_ack_delay),
        "private_data": bytes(lap.pdata),
    })  # fmt: skip


def build_apr(apr: CmApr, *, local_comm_id: int, remote_comm_id: int) -> bytes:
    """An APR's 232 bytes."""
    apr.validate()
    info = bytes(apr.info)
    return _encode(CmAttr.APR, {
        "local_comm_id": local_comm_id, "remote_comm_id": remote_comm_id,
        "additional_info_length": len(info), "status": int(apr.apr_status),
        "additional_info": info + bytes(72 - len(info)), "private_data": bytes(apr.pdata),
    })  # fmt: skip


def build_sidr_req(req: CmReq, *, request_id: int) -> bytes:
    """A SIDR_REQ's 232 bytes from a UD :class:`CmReq`; its P_Key is ``req.pkey``, else
    the primary path's."""
    req.validate()
    if req.qp_type is not QpType.UD:
        raise InvalidParameter("a SIDR_REQ comes from a UD request")
    pkey = req.pkey
    if not pkey and req.primary_path is not None:
        pkey = int(check_path("primary_path", req.primary_path)["p_key"])
    return _encode(CmAttr.SIDR_REQ, {"request_id": request_id, "pkey": pkey,
                                     "service_id": req.svc_id,
                                     "private_data": bytes(req.pdata)})  # fmt: skip


def build_sidr_rep(rep: CmRep, *, request_id: int, service_id: int, qpn: int = 0,
                   qkey: int = 0) -> bytes:  # fmt: skip
    """A SIDR_REP's 232 bytes: ``qpn``/``qkey`` of the UD QP (status SUCCESS), or the
    ClassPortInfo of ``rep.class_info`` (REDIRECT)."""
    rep.validate()
    if rep.qp_type is not QpType.UD:
        raise InvalidParameter("a SIDR_REP comes from a UD reply")
    info = bytes(rep.class_info)
    return _encode(CmAttr.SIDR_REP, {
        "request_id": request_id, "status": int(rep.status),
        "additional_info_length": len(info), "qpn": qpn, "service_id": service_id,
        "qkey": qkey, "additional_info": info + bytes(72 - len(info)),
        "private_data": bytes(rep.pdata),
    })  # fmt: skip


# ------------------------------------------------------------------ records


def _pd(f: Fields) -> bytes:
    v = f["private_data"]
    assert isinstance(v, bytes)
    return v


def req_rec(req: Fields) -> CmReqRec:
    """The REQ callback's record of a received REQ (paths as the passive side sees them)."""
    return CmReqRec(
        pdata=_pd(req), qp_type=qp_type_of(req), svc_id=int(req["service_id"]),
        resp_res=int(req["responder_resources"]), init_depth=int(req["initiator_depth"]),
        flow_ctrl=bool(req["end_to_end_flow_control"]),
        rnr_retry_cnt=int(req["rnr_retry_count"]), primary_path=path_from_req(req),
        alt_path=path_from_req(req, "alternate") if has_alternate(req) else None,
        pkey=int(req["pkey"]), remote_ca_guid=int(req["local_ca_guid"]),
        remote_qpn=int(req["local_qpn"]),
    )  # fmt: skip


def sidr_req_rec(req: Fields) -> CmReqRec:
    """The REQ callback's record of a SIDR_REQ (``qp_type`` UD)."""
    return CmReqRec(pdata=_pd(req), qp_type=QpType.UD, svc_id=int(req["service_id"]),
                    pkey=int(req["pkey"]))  # fmt: skip


def rep_rec(rep: Fields) -> CmRepRec:
    """The REP callback's record of a received REP (``qp_type`` RC: the CM knows better)."""
    fo = int(rep["failover_accepted"])
    return CmRepRec(
        pdata=_pd(rep), resp_res=int(rep["responder_resources"]),
        flow_ctrl=bool(rep["end_to_end_flow_control"]),
        apr_status=CmFailover(fo) if fo in set(CmFailover) else CmFailover.ERROR,
    )  # fmt: skip


def sidr_rep_rec(rep: Fields) -> CmRepRec:
    """The REP callback's record of a SIDR_REP."""
    st = int(rep["status"])
    info = rep["additional_info"]
    assert isinstance(info, bytes)
    return CmRepRec(
        pdata=_pd(rep), qp_type=QpType.UD,
        status=SidrStatus(st) if st in set(SidrStatus) else SidrStatus.REJECT,
        remote_qp=int(rep["qpn"]), remote_qkey=int(rep["qkey"]),
        class_info=info[: int(rep["additional_info_length"])],
    )  # fmt: skip


def rtu_rec(rtu: Fields) -> CmRtuRec:
    return CmRtuRec(pdata=_pd(rtu))


def rej_rec(rej: Fields) -> CmRejRec:
    """The REJ callback's record: the reason (a ``RejReason`` when known) and the ARI."""
    ari = rej["ari"]
    assert isinstance(ari, bytes)
    reason = int(rej["reason"])
    return CmRejRec(
        rej_status=RejReason(reason) if reason in set(RejReason) else reason,
        ari=ari[: min(int(rej["reject_info_length"]), ARI_SIZE)], pdata=_pd(rej),
    )  # fmt: skip


def mra_rec(mra: Fields) -> CmMraRec:
    return CmMraRec(pdata=_pd(mra), svc_timeout=int(mra["service_timeout"]))


def dreq_rec(dreq: Fields) -> CmDreqRec:
    return CmDreqRec(pdata=_pd(dreq))


def drep_rec(drep: Fields) -> CmDrepRec:
    return CmDrepRec(pdata=_pd(drep))


def lap_rec(lap: Fields, *, pkey: int, mtu: int) -> CmLapRec:
    """The LAP callback's record: the proposed alternate path as the receiver sees it
    (``pkey``/``mtu``: the connection's)."""
    return CmLapRec(alt_path=path_from_lap(lap, pkey=pkey, mtu=mtu), pdata=_pd(lap))


def apr_rec(apr: Fields) -> CmAprRec:
    info = apr["additional_info"]
    assert isinstance(info, bytes)
    st = int(apr["status"])
    return CmAprRec(
        apr_status=AprStatus(st) if st in set(AprStatus) else st,
        info=info[: min(int(apr["additional_info_length"]), 72)], pdata=_pd(apr),
    )  # fmt: skip


def to_rec(attr: CmAttr, fields: Fields, *, pkey: int = 0xFFFF, mtu: int = 3) -> Any:
    """The record of any received message (``pkey``/``mtu`` are used by LAP only).

    Any data area the tables decode converts; the one exception is a REQ of a
    transport other than RC/UC (:class:`PathMismatch`: :func:`check_req` first).
    """
    a = CmAttr(attr)
    if a is CmAttr.LAP:
        return lap_rec(fields, pkey=pkey, mtu=mtu)
    return _RECS[a](fields)


_RECS: Final = {
    CmAttr.REQ: req_rec, CmAttr.SIDR_REQ: sidr_req_rec, CmAttr.REP: rep_rec,
    CmAttr.SIDR_REP: sidr_rep_rec, CmAttr.RTU: rtu_rec, CmAttr.REJ: rej_rec,
    CmAttr.MRA: mra_rec, CmAttr.DREQ: dreq_rec, CmAttr.DREP: drep_rec, CmAttr.APR: apr_rec,
}  # fmt: skip
