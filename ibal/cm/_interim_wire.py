"""Interim message building and QP attributes for the CM API, until ``ibal.cm.wire`` lands.

Owner A's ``ibal/cm/wire.py`` is the home of these conversions (records + local facts
-> CM message bytes, REQ/REP -> QpMods); this module holds the minimum the I/O layer
and API need meanwhile, built on the ``ibal.mad.cm`` tables, and goes away when
wire.py is merged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.mad import cm as cmw
from ibal.mad.cm import CmAttr, MessageMraed, TransportType
from ibal.types import AccessFlags, AvAttr, Gid, Grh, Mtu, PortAttr, QpMod, QpState
from ibal.wire.fields import Value

Fields = Mapping[str, Value]


def cm_ack_timeout(ca_ack_delay: int, packet_life: int) -> int:
    """The local ACK timeout a REQ carries (Linux ``cm_ack_timeout``): 2 * packet life + the
    CA's ACK delay, in the exponent form, capped at 31."""
    life = packet_life + 1
    if ca_ack_delay >= life:
        t = ca_ack_delay + (1 if ca_ack_delay - life < 1 else 0)
    else:
        t = life + (1 if life - ca_ack_delay < 1 else 0)
    return min(t, 31)


def _pd(attr: CmAttr, pdata: bytes) -> bytes:
    size = cmw.PRIVATE_DATA_SIZE[attr]
    return bytes(pdata).ljust(size, b"\0")


def _gid_bytes(v: Value | None) -> bytes:
    if isinstance(v, bytes | bytearray) and len(v) == 16:
        return bytes(v)
    return bytes(16)


def _i(v: Value | None, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def path_fields(prefix: str, path: Fields | None, ack_timeout: int, roce: bool) -> dict[str, Value]:
    """A REQ's primary/alternate path fields from a PathRecord's fields (zeros for none)."""
    if path is None:
        return {f"{prefix}_{k}": v for k, v in (
            ("local_lid", 0), ("remote_lid", 0), ("local_gid", bytes(16)),
            ("remote_gid", bytes(16)), ("flow_label", 0), ("packet_rate", 0),
            ("traffic_class", 0), ("hop_limit", 0), ("sl", 0), ("subnet_local", False),
            ("local_ack_timeout", 0))}  # fmt: skip
    hop = _i(path.get("hop_limit"))
    off_subnet = hop > 1
    return {
        f"{prefix}_local_lid": 0xFFFF if roce or off_subnet else _i(path.get("slid")),
        f"{prefix}_remote_lid": 0xFFFF if roce or off_subnet else _i(path.get("dlid")),
        f"{prefix}_local_gid": _gid_bytes(path.get("sgid")),
        f"{prefix}_remote_gid": _gid_bytes(path.get("dgid")),
        f"{prefix}_flow_label": _i(path.get("flow_label")),
        f"{prefix}_packet_rate": _i(path.get("rate")),
        f"{prefix}_traffic_class": _i(path.get("tclass")),
        f"{prefix}_hop_limit": hop,
        f"{prefix}_sl": _i(path.get("sl")),
        f"{prefix}_subnet_local": not (roce or off_subnet),
        f"{prefix}_local_ack_timeout": ack_timeout,
    }


def build_req(*, local_comm_id: int, service_id: int, local_ca_guid: int, local_qpn: int,
              starting_psn: int, path: Fields, alt_path: Fields | None, roce: bool,
              ca_ack_delay: int, resp_res: int, init_depth: int, remote_resp_timeout: int,
              local_resp_timeout: int, retry_cnt: int, rnr_retry_cnt: int, max_cm_retries: int,
              flow_ctrl: bool, srq: bool, pdata: bytes,
              transport: TransportType = TransportType.RC) -> bytes:  # fmt: skip
    life = _i(path.get("packet_life_time"), 16)
    ack = cm_ack_timeout(ca_ack_delay, life)
    alt_ack = cm_ack_timeout(ca_ack_delay, _i(alt_path.get("packet_life_time"), 16)) \
        if alt_path is not None else 0  # fmt: skip
    values: dict[str, Value] = {
        "local_comm_id": local_comm_id, "vendor_id": 0, "service_id": service_id,
        "local_ca_guid": local_ca_guid, "local_qkey": 0, "local_qpn": local_qpn,
        "responder_resources": resp_res, "local_eecn": 0, "initiator_depth": init_depth,
        "remote_eecn": 0, "remote_cm_response_timeout": remote_resp_timeout,
        "transport_type": transport, "end_to_end_flow_control": flow_ctrl,
        "starting_psn": starting_psn, "local_cm_response_timeout": local_resp_timeout,
        "retry_count": retry_cnt, "pkey": _i(path.get("p_key"), 0xFFFF) or 0xFFFF,
        "path_mtu": _i(path.get("mtu"), 3), "rdc_exists": False,
        "rnr_retry_count": rnr_retry_cnt, "max_cm_retries": max_cm_retries, "srq": srq,
        "extended_transport_type": 0, "sap_supported": False,
        "private_data": _pd(CmAttr.REQ, pdata),
        **path_fields("primary", path, ack, roce),
        **path_fields("alternate", alt_path, alt_ack, roce),
    }  # fmt: skip
    return cmw.REQ.encode(values)


def build_rep(*, local_comm_id: int, remote_comm_id: int, local_qpn: int, starting_psn: int,
              resp_res: int, init_depth: int, target_ack_delay: int, failover_accepted: int,
              flow_ctrl: bool, rnr_retry_cnt: int, srq: bool, local_ca_guid: int,
              pdata: bytes) -> bytes:  # fmt: skip
    return cmw.REP.encode({
        "local_comm_id": local_comm_id, "remote_comm_id": remote_comm_id, "local_qkey": 0,
        "local_qpn": local_qpn, "vendor_id_h": 0, "local_eecn": 0, "vendor_id_m": 0,
        "starting_psn": starting_psn, "vendor_id_l": 0, "responder_resources": resp_res,
        "initiator_depth": init_depth, "target_ack_delay": target_ack_delay,
        "failover_accepted": failover_accepted, "end_to_end_flow_control": flow_ctrl,
        "rnr_retry_count": rnr_retry_cnt, "srq": srq, "local_ca_guid": local_ca_guid,
        "private_data": _pd(CmAttr.REP, pdata),
    })  # fmt: skip


def build_ids(attr: CmAttr, local_comm_id: int, remote_comm_id: int, pdata: bytes,
              **extra: Value) -> bytes:  # fmt: skip
    """RTU, DREP (ids + private data), DREQ (+ remote_qpn), MRA, REJ, APR (+ their fields)."""
    table = cmw.TABLES[attr]
    values: dict[str, Value] = {"local_comm_id": local_comm_id,
                                "remote_comm_id": remote_comm_id,
                                "private_data": _pd(attr, pdata)}  # fmt: skip
    values.update(extra)
    return table.encode(values)  # the fields not given are zero


def build_rej(local_comm_id: int, remote_comm_id: int, rejected: MessageMraed, reason: int,
              ari: bytes, pdata: bytes) -> bytes:  # fmt: skip
    return build_ids(CmAttr.REJ, local_comm_id, remote_comm_id, pdata,
                     message_rejected=rejected, reject_info_length=len(ari), reason=reason,
                     ari=bytes(ari).ljust(72, b"\0"))  # fmt: skip


def build_mra(local_comm_id: int, remote_comm_id: int, mraed: MessageMraed,
              service_timeout: int, pdata: bytes) -> bytes:  # fmt: skip
    return build_ids(CmAttr.MRA, local_comm_id, remote_comm_id, pdata, message_mraed=mraed,
                     service_timeout=service_timeout)  # fmt: skip


def build_sidr_req(request_id: int, pkey: int, service_id: int, pdata: bytes) -> bytes:
    return cmw.SIDR_REQ.encode(request_id=request_id, pkey=pkey, service_id=service_id,
                               private_data=_pd(CmAttr.SIDR_REQ, pdata))  # fmt: skip


def build_sidr_rep(request_id: int, status: int, qpn: int, service_id: int, qkey: int,
                   info: bytes, pdata: bytes) -> bytes:  # fmt: skip
    return cmw.SIDR_REP.encode({
        "request_id": request_id, "status": status, "additional_info_length": len(info),
        "vendor_id_h": 0, "qpn": qpn, "vendor_id_l": 0, "service_id": service_id, "qkey": qkey,
        "additional_info": bytes(info).ljust(72, b"\0"),
        "private_data": _pd(CmAttr.SIDR_REP, pdata),
    })  # fmt: skip


# ---------------------------------------------------------------- QP attributes


def init_mod(port_num: int, pkey_index: int, access: AccessFlags) -> QpMod:
    return QpMod(QpState.INIT, port_num=port_num, pkey_index=pkey_index, access=access)


def _gid_index(port: PortAttr, gid: bytes) -> int:
    return next((e.index for e in port.gid_table if e.gid.packed == gid), 0)


def av_from_req(port: PortAttr, req: Fields, roce: bool) -> AvAttr:
    """The passive side's path back to the active side (the REQ's primary path, reversed)."""
    grh = None
    if roce or not req.get("primary_subnet_local"):
        grh = Grh(dgid=Gid(_gid_bytes(req.get("primary_local_gid"))),
                  sgid_index=_gid_index(port, _gid_bytes(req.get("primary_remote_gid"))),
                  flow_label=_i(req.get("primary_flow_label")),
                  hop_limit=_i(req.get("primary_hop_limit"), 64) or 64,
                  traffic_class=_i(req.get("primary_traffic_class")))  # fmt: skip
    dlid = 0 if roce else _i(req.get("primary_local_lid"))
    return AvAttr(port_num=port.port_num, dlid=dlid, sl=_i(req.get("primary_sl")), grh=grh,
                  static_rate=0)  # fmt: skip


def av_from_path(port: PortAttr, path: Fields, roce: bool) -> AvAttr:
    """The active side's path to the passive side."""
    grh = None
    hop = _i(path.get("hop_limit"))
    if roce or hop > 1:
        grh = Grh(dgid=Gid(_gid_bytes(path.get("dgid"))),
                  sgid_index=_gid_index(port, _gid_bytes(path.get("sgid"))),
                  flow_label=_i(path.get("flow_label")), hop_limit=hop or 64,
                  traffic_class=_i(path.get("tclass")))  # fmt: skip
    return AvAttr(port_num=port.port_num, dlid=0 if roce else _i(path.get("dlid")),
                  sl=_i(path.get("sl")), grh=grh)  # fmt: skip


def passive_mods(target: QpState, port: PortAttr, req: Fields, rep: Fields, roce: bool,
                 rnr_nak_timeout: int) -> list[QpMod]:  # fmt: skip
    if target is QpState.RTR:
        return [QpMod(QpState.RTR, primary_av=av_from_req(port, req, roce),
                      path_mtu=Mtu(_i(req.get("path_mtu"), 3)), dest_qp=_i(req.get("local_qpn")),
                      rq_psn=_i(req.get("starting_psn")),
                      resp_res=_i(rep.get("responder_resources")),
                      rnr_nak_timeout=rnr_nak_timeout)]  # fmt: skip
    if target is QpState.RTS:
        return [QpMod(QpState.RTS, sq_psn=_i(rep.get("starting_psn")),
                      local_ack_timeout=_i(req.get("primary_local_ack_timeout")),
                      retry_cnt=_i(req.get("retry_count")),
                      rnr_retry_cnt=_i(req.get("rnr_retry_count")),
                      init_depth=_i(rep.get("initiator_depth")))]  # fmt: skip
    return []


def active_mods(target: QpState, port: PortAttr, path: Fields, req: Fields, rep: Fields,
                roce: bool, rnr_nak_timeout: int) -> list[QpMod]:  # fmt: skip
    if target is QpState.RTR:
        return [QpMod(QpState.RTR, primary_av=av_from_path(port, path, roce),
                      path_mtu=Mtu(_i(req.get("path_mtu"), 3)), dest_qp=_i(rep.get("local_qpn")),
                      rq_psn=_i(rep.get("starting_psn")),
                      resp_res=min(_i(req.get("responder_resources")),
                                   _i(rep.get("initiator_depth"))),
                      rnr_nak_timeout=rnr_nak_timeout)]  # fmt: skip
    if target is QpState.RTS:
        return [QpMod(QpState.RTS, sq_psn=_i(req.get("starting_psn")),
                      local_ack_timeout=_i(req.get("primary_local_ack_timeout")),
                      retry_cnt=_i(req.get("retry_count")),
                      rnr_retry_cnt=_i(rep.get("rnr_retry_count")),
                      init_depth=min(_i(req.get("initiator_depth")),
                                     _i(rep.get("responder_resources"))))]  # fmt: skip
    return []


def as_dict(fields: Fields) -> dict[str, Any]:
    return dict(fields)
