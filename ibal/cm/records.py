"""The IBAL CM requests and records (``ib_cm_*_t``) as Pythonic, checked records.

Each record names its ``ib_al.h`` original in its docstring; pointer + length
pairs (``p_req_pdata``/``req_length``, ``p_ari``/``ari_length`` ...) are one
``bytes`` value, handles are the objects the CM API hands out, ``IB_FLAGS_SYNC``
is :attr:`AlFlags.SYNC`.  Paths (``ib_path_rec_t``) are PathRecords by field
name, as :func:`ibal.sa.query.path_records` and :mod:`ibal.sa.roce` give them
(``ibal.wire.mad.sa.PATH_RECORD`` names: ``sgid``, ``dgid``, ``slid``, ``dlid``,
``p_key``, ``mtu``, ``packet_life_time`` ...).

Requests check themselves with ``validate()`` (called by the CM API before
anything is sent) and raise the seed's statuses: ``InvalidParameter`` for a
value of the wrong kind, ``InvalidSetting`` for one past a limit, the message
naming the field and the limit.  Records (``*Rec``) are built by
:mod:`ibal.cm.wire` from received messages; the CM fills their handles.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

from ibal.records import record
from ibal.status import InvalidParameter, InvalidSetting, Status
from ibal.types import AccessFlags, QpType
from ibal.wire.mad.cm import (
    PRIVATE_DATA_SIZE,
    AprStatus,
    CmAttr,
    RejReason,
    SidrStatus,
)

__all__ = [
    "ALL_CAS",
    "ALL_LIDS",
    "ALL_PKEYS",
    "ALL_PORTS",
    "APR_INFO_SIZE",
    "APR_PDATA_SIZE",
    "ARI_SIZE",
    "DREP_PDATA_SIZE",
    "DREQ_PDATA_SIZE",
    "LAP_PDATA_SIZE",
    "MRA_PDATA_SIZE",
    "PATH_FIELDS",
    "PDATA_MAX",
    "REJ_PDATA_SIZE",
    "REP_PDATA_SIZE",
    "REQ_PDATA_SIZE",
    "RTU_PDATA_SIZE",
    "SIDR_REP_PDATA_SIZE",
    "SIDR_REQ_PDATA_SIZE",
    "AlFlags",
    "AprStatus",
    "CepListen",
    "CmApr",
    "CmAprRec",
    "CmDrep",
    "CmDrepRec",
    "CmDreq",
    "CmDreqRec",
    "CmFailover",
    "CmLap",
    "CmLapRec",
    "CmListen",
    "CmMra",
    "CmMraRec",
    "CmRej",
    "CmRejRec",
    "CmRep",
    "CmRepRec",
    "CmReq",
    "CmReqRec",
    "CmRtu",
    "CmRtuRec",
    "ListenErrRec",
    "PathRec",
    "RejReason",
    "SidrStatus",
    "check_path",
    "check_pdata",
]  # fmt: skip

# ------------------------------------------------------------------ constants

#: ``ib_listen_info_t``: the wildcards of a directed listen (``IB_ALL_CAS`` ...).
ALL_CAS: Final = 0
ALL_PORTS: Final = 0
ALL_LIDS: Final = 0
ALL_PKEYS: Final = 0


class AlFlags(enum.IntFlag):
    """``ib_al_flags_t``: ``IB_FLAGS_SYNC`` makes the call block until it completes."""

    NONE = 0
    SYNC = 0x0000_0001


class CmFailover(enum.IntEnum):
    """``ib_cm_failover_t``: REP's FailoverAccepted (``IB_FAILOVER_ACCEPT_*``)."""

    SUCCESS = 0
    UNSUPPORTED = 1
    ERROR = 2


#: ``ib_cm_data_sizes_t`` (CM class version 2): ``IB_REQ_PDATA_SIZE`` ... in bytes,
#: read from the message tables of :mod:`ibal.wire.mad.cm` (the private data field of each).
REQ_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.REQ]  # 92
REP_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.REP]  # 196
RTU_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.RTU]  # 224
REJ_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.REJ]  # 148
MRA_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.MRA]  # 222
DREQ_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.DREQ]  # 220
DREP_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.DREP]  # 224
LAP_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.LAP]  # 168
APR_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.APR]  # 148
SIDR_REQ_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.SIDR_REQ]  # 216
SIDR_REP_PDATA_SIZE: Final = PRIVATE_DATA_SIZE[CmAttr.SIDR_REP]  # 136
#: ``IB_ARI_SIZE`` (``ib_ari_t``) and ``IB_APR_INFO_SIZE`` (``ib_apr_info_t``).
ARI_SIZE: Final = 72
APR_INFO_SIZE: Final = 72

#: The private data limit of every CM message (``PDATA_MAX[CmAttr.REQ]`` is 92).
PDATA_MAX: Final[Mapping[CmAttr, int]] = dict(PRIVATE_DATA_SIZE)

_MSG_NAME = {a: a.name for a in CmAttr}

PathRec = Mapping[str, Any]
"""``ib_path_rec_t``: a PathRecord by ``ibal.wire.mad.sa.PATH_RECORD`` field name (a decoded
dict, an ``ibal.sa.query.Record`` or ``ibal.sa.roce.RocePath.record``)."""

#: The PathRecord fields a CM path uses (``raw_traffic``, ``reversible``, selectors ...
#: may be present and are ignored).  ``sgid``, ``dgid``, ``mtu`` and ``packet_life_time``
#: are required; the others default as in the SA's table (LIDs 0, P_Key 0xFFFF, ...):
#: ``ibal.sa.roce.RocePath.record`` has no LIDs.
PATH_FIELDS: Final = (
    "sgid", "dgid", "slid", "dlid", "flow_label", "hop_limit", "tclass", "p_key", "sl",
    "mtu", "rate", "packet_life_time",
)  # fmt: skip
_PATH_REQUIRED: Final = ("sgid", "dgid", "mtu", "packet_life_time")
_PATH_DEFAULTS: Final[dict[str, Any]] = {
    "slid": 0, "dlid": 0, "flow_label": 0, "hop_limit": 0, "tclass": 0, "p_key": 0xFFFF,
    "sl": 0, "rate": 0,
}  # fmt: skip

# ------------------------------------------------------------------ checks


_BYTES_LIKE: Final = (bytes, bytearray, memoryview)  # a tuple: ``A | B`` builds a union per call


def _bytes(name: str, v: object) -> bytes:
    if not isinstance(v, _BYTES_LIKE):
        raise InvalidParameter(f"{name} must be bytes, not {type(v).__name__}")
    return bytes(v)


def check_pdata(attr: CmAttr, data: object, *, what: str = "private data") -> bytes:
    """``data`` as bytes if it fits ``attr``'s private data, else ``InvalidSetting``.

    ``InvalidParameter`` when it is not bytes-like.  The message names the
    message and the limit: "REQ private data is 93 bytes; at most 92".
    """
    b = _bytes(f"{_MSG_NAME[attr]} {what}", data)
    limit = PDATA_MAX[attr]
    if len(b) > limit:
        raise InvalidSetting(f"{_MSG_NAME[attr]} {what} is {len(b)} bytes; at most {limit}")
    return b


def _info(name: str, data: object, limit: int) -> bytes:
    b = _bytes(name, data)
    if len(b) > limit:
        raise InvalidSetting(f"{name} is {len(b)} bytes; at most {limit}")
    return b


def _uint(name: str, v: object, bits: int) -> int:
    if type(v) is not int and not (isinstance(v, int) and not isinstance(v, bool)):
        raise InvalidParameter(f"{name} must be an int, not {type(v).__name__}")
    if not 0 <= v < (1 << bits):
        raise InvalidSetting(f"{name} is {v}; it must be 0..{(1 << bits) - 1}")
    return int(v)


def _bool(name: str, v: object) -> None:
    if not isinstance(v, int):
        raise InvalidParameter(f"{name} must be a bool")


def _callable(name: str, v: object, required: bool = False) -> None:
    if v is None:
        if required:
            raise InvalidParameter(f"{name} is required")
        return
    if not callable(v):
        raise InvalidParameter(f"{name} must be callable")


def _gid(name: str, v: object) -> bytes:
    packed = getattr(v, "packed", v)
    if not isinstance(packed, _BYTES_LIKE[:2]) or len(packed) != 16:
        raise InvalidParameter(f"{name} must be a GID (16 bytes or ibal.types.Gid)")
    return bytes(packed)


# Paths that passed, by identity and content (the entry holds the dict, so its id is not
# reused; a caller's later change to it misses): one resolved route serves a burst of
# connections, each checking its path five times.
_checked_paths: dict[int, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def check_path(name: str, path: object) -> dict[str, Any]:
    """A PathRecord usable by the CM, as a dict of :data:`PATH_FIELDS` (defaults filled
    in); else ``InvalidParameter`` (not a mapping, a required field missing, a value of
    the wrong type) or ``InvalidSetting`` (the seed's "packet lifetime or pkey out of
    range", an MTU code that is not 1..5)."""
    hit = _checked_paths.get(id(path))
    if hit is not None and hit[0] is path and hit[1] == path:
        return dict(hit[2])
    p = _check_path(name, path)
    if type(path) is dict:
        if len(_checked_paths) >= 256:
            _checked_paths.clear()
        _checked_paths[id(path)] = (path, dict(path), dict(p))
    return p


def _check_path(name: str, path: object) -> dict[str, Any]:
    if not isinstance(path, Mapping):
        raise InvalidParameter(f"{name} must be a PathRecord (a mapping of its fields)")
    missing = [f for f in _PATH_REQUIRED if f not in path]
    if missing:
        raise InvalidParameter(f"{name} lacks {', '.join(missing)}")
    p = {f: path[f] if f in path else _PATH_DEFAULTS[f] for f in PATH_FIELDS}
    p["sgid"] = _gid(f"{name}.sgid", p["sgid"])
    p["dgid"] = _gid(f"{name}.dgid", p["dgid"])
    for f, bits in (("slid", 16), ("dlid", 16), ("flow_label", 20), ("hop_limit", 8),
                    ("tclass", 8), ("sl", 4), ("rate", 6)):  # fmt: skip
        p[f] = _uint(f"{name}.{f}", p[f], bits)
    pkey = p["p_key"] = _uint(f"{name}.p_key", p["p_key"], 16)
    if pkey & 0x7FFF == 0:
        raise InvalidSetting(f"{name}.p_key {pkey:#06x} is not a valid P_Key")
    mtu = p["mtu"] = _uint(f"{name}.mtu", p["mtu"], 6)
    if not 1 <= mtu <= 5:
        raise InvalidSetting(f"{name}.mtu {mtu} is not an IB MTU code (1..5)")
    life = p["packet_life_time"] = _uint(f"{name}.packet_life_time", p["packet_life_time"], 6)
    if life > 30:  # the ACK timeout is life + 1 in 5 bits
        raise InvalidSetting(f"{name}.packet_life_time is {life}; at most 30")
    return p


def _qp_type(v: object, allowed: tuple[QpType, ...]) -> None:
    if not isinstance(v, QpType):
        raise InvalidParameter(f"qp_type must be an ibal.types.QpType, not {v!r}")
    if v not in allowed:
        names = ", ".join(t.name for t in allowed)
        raise InvalidSetting(f"qp_type {v.name} is not supported by the CM (only {names})")


def _flags(v: object) -> None:
    if not isinstance(v, int) or int(v) & ~int(AlFlags.SYNC):
        raise InvalidParameter(f"flags {v!r} is not an AlFlags")


_CONNECTED = (QpType.RC, QpType.UC)


# ------------------------------------------------------------------ listen


@record(frozen=True, kw_only=True)
class CmListen:
    """``ib_cm_listen_t``: where REQs (or SIDR_REQs: ``qp_type`` UD) for ``svc_id`` go.

    ``ca_guid``/``port_guid``/``lid``/``pkey`` direct the listen (0: the
    ``ALL_*`` wildcards); ``compare_buffer`` at ``compare_offset`` in the
    REQ's private data tells apart listens sharing ``svc_id``
    (``p_compare_buffer``/``compare_length``); ``req_cb`` is ``pfn_cm_req_cb``.
    """

    svc_id: int
    req_cb: Callable[..., Any] | None = None
    ca_guid: int = ALL_CAS
    port_guid: int = ALL_PORTS
    lid: int = ALL_LIDS
    pkey: int = ALL_PKEYS
    compare_buffer: bytes = b""
    compare_offset: int = 0
    qp_type: QpType = QpType.RC
    sidr_context: Any = None
    backlog: int = 128
    """Half-open connections the listen holds at most (``rdma_listen``'s backlog): a REQ
    beyond them gets REJ "no resources" (REJ reason 3) and no endpoint."""

    @property
    def compare_length(self) -> int:
        return len(self.compare_buffer)

    def validate(self) -> None:
        _uint("svc_id", self.svc_id, 64)
        _callable("req_cb", self.req_cb, required=True)
        _uint("ca_guid", self.ca_guid, 64)
        _uint("port_guid", self.port_guid, 64)
        _uint("lid", self.lid, 16)
        _uint("pkey", self.pkey, 16)
        _uint("backlog", self.backlog, 16)
        if not self.backlog:
            raise InvalidParameter("a listen's backlog is at least 1")
        _qp_type(self.qp_type, (*_CONNECTED, QpType.UD))
        _check_compare(self.qp_type, self.compare_buffer, self.compare_offset)


def _check_compare(qp_type: QpType, buf: object, offset: object) -> None:
    b = _bytes("compare_buffer", buf)
    off = _uint("compare_offset", offset, 8)
    attr = CmAttr.SIDR_REQ if qp_type is QpType.UD else CmAttr.REQ
    if off + len(b) > PDATA_MAX[attr]:
        raise InvalidSetting(
            f"compare_offset {off} + compare_length {len(b)} passes the end of the "
            f"{attr.name} private data ({PDATA_MAX[attr]} bytes)"
        )


@record(frozen=True, kw_only=True)
class CepListen:
    """``ib_cep_listen_t``: the CEP-level listen (``svc_id``, ``port_guid``,
    ``p_cmp_buf``/``cmp_len`` as ``compare_buffer``, ``cmp_offset``)."""

    svc_id: int
    port_guid: int = ALL_PORTS
    compare_buffer: bytes = b""
    compare_offset: int = 0

    def validate(self) -> None:
        _uint("svc_id", self.svc_id, 64)
        _uint("port_guid", self.port_guid, 64)
        _check_compare(QpType.RC, self.compare_buffer, self.compare_offset)


@record(frozen=True, kw_only=True)
class ListenErrRec:
    """``ib_listen_err_rec_t``: a listen made invalid by a local change
    (``listen_context``, ``reason``, ``h_cm_listen`` as ``listen``)."""

    listen_context: Any
    reason: Status
    listen: Any = None


# ------------------------------------------------------------------ REQ


@record(frozen=True, kw_only=True)
class CmReq:
    """``ib_cm_req_t``: a connection request (RC/UC), or a SIDR request (UD).

    Connected: ``qp`` (``h_qp``), ``primary_path`` (``p_primary_path``),
    ``alt_path`` (``p_alt_path``), ``resp_res``, ``init_depth``, the CM
    response timeouts (4.096 µs * 2^value), ``flow_ctrl``, ``rnr_nak_timeout``,
    ``rnr_retry_cnt``, ``retry_cnt``; ``req_cb`` only for peer-to-peer (with
    ``compare_buffer``/``compare_offset``).  UD (SIDR): ``al`` (``h_al``),
    ``sidr_context``, ``timeout_ms``, ``pkey``.  ``pdata`` is
    ``p_req_pdata``/``req_length``; the defaults are what Linux's RDMA CM sends
    (response timeouts 20, 15 CM retries, retry and RNR retry 7).
    """

    svc_id: int
    primary_path: PathRec | None = None
    qp: Any = None
    rep_cb: Callable[..., Any] | None = None
    flags: AlFlags = AlFlags.NONE
    max_cm_retries: int = 15
    pdata: bytes = b""
    qp_type: QpType = QpType.RC
    compare_buffer: bytes = b""
    compare_offset: int = 0
    resp_res: int = 0
    init_depth: int = 0
    remote_resp_timeout: int = 20
    flow_ctrl: bool = False
    local_resp_timeout: int = 20
    rnr_nak_timeout: int = 12
    rnr_retry_cnt: int = 7
    retry_cnt: int = 7
    alt_path: PathRec | None = None
    req_cb: Callable[..., Any] | None = None
    mra_cb: Callable[..., Any] | None = None
    rej_cb: Callable[..., Any] | None = None
    al: Any = None
    sidr_context: Any = None
    timeout_ms: int = 0
    pkey: int = 0

    @property
    def sync(self) -> bool:
        return bool(self.flags & AlFlags.SYNC)

    @property
    def attr(self) -> CmAttr:
        """The message this request sends: REQ, or SIDR_REQ for a UD ``qp_type``."""
        return CmAttr.SIDR_REQ if self.qp_type is QpType.UD else CmAttr.REQ

    def validate(self) -> None:
        _uint("svc_id", self.svc_id, 64)
        _flags(self.flags)
        _callable("rep_cb", self.rep_cb, required=True)
        _qp_type(self.qp_type, (*_CONNECTED, QpType.UD))
        check_pdata(self.attr, self.pdata)
        if self.qp_type is QpType.UD:
            _uint("timeout_ms", self.timeout_ms, 32)
            _uint("pkey", self.pkey, 16)
            _uint("max_cm_retries", self.max_cm_retries, 4)
            if self.primary_path is not None:
                check_path("primary_path", self.primary_path)
            elif self.pkey & 0x7FFF == 0:
                raise InvalidSetting(f"pkey {self.pkey:#06x} is not a valid P_Key")
            return
        if self.qp is None:
            raise InvalidParameter("qp is required for an RC/UC request")
        if self.primary_path is None:
            raise InvalidParameter("primary_path is required for an RC/UC request")
        check_path("primary_path", self.primary_path)
        if self.alt_path is not None:
            check_path("alt_path", self.alt_path)
            if self.alt_path["mtu"] != self.primary_path["mtu"]:
                raise InvalidSetting(
                    f"alt_path MTU code {self.alt_path['mtu']} differs from the primary "
                    f"path's {self.primary_path['mtu']}"
                )
        for name, bits in (("max_cm_retries", 4), ("resp_res", 8), ("init_depth", 8),
                           ("remote_resp_timeout", 5), ("local_resp_timeout", 5),
                           ("rnr_nak_timeout", 5), ("rnr_retry_cnt", 3),
                           ("retry_cnt", 3)):  # fmt: skip
            _uint(name, getattr(self, name), bits)
        _bool("flow_ctrl", self.flow_ctrl)
        _callable("req_cb", self.req_cb)
        _callable("mra_cb", self.mra_cb)
        _callable("rej_cb", self.rej_cb)
        if self.req_cb is None and self.compare_buffer:
            raise InvalidSetting("compare_buffer applies to peer-to-peer requests (req_cb) only")
        _check_compare(self.qp_type, self.compare_buffer, self.compare_offset)


@record(frozen=True, kw_only=True)
class CmReqRec:
    """``ib_cm_req_rec_t``: a received REQ (or SIDR_REQ) as the REQ callback sees it.

    ``context`` (listen or QP context), ``cm_req`` (``h_cm_req``), ``listen``
    (``h_cm_listen``) are filled by the CM; ``pdata`` (``p_req_pdata``) is the
    whole private data area.  ``resp_res`` is the requester's responder
    resources (RDMA reads/atomics it accepts from this side: the REP's
    ``init_depth`` may not exceed it).  Added: ``svc_id``, ``init_depth`` (the
    requester's initiator depth), ``remote_ca_guid``, ``remote_qpn``.
    """

    pdata: bytes
    qp_type: QpType
    svc_id: int = 0
    context: Any = None
    cm_req: Any = None
    listen: Any = None
    resp_res: int = 0
    init_depth: int = 0
    flow_ctrl: bool = False
    rnr_retry_cnt: int = 0
    primary_path: PathRec | None = None
    alt_path: PathRec | None = None
    pkey: int = 0
    sidr_context: Any = None
    remote_ca_guid: int = 0
    remote_qpn: int = 0


# ------------------------------------------------------------------ REP


@record(frozen=True, kw_only=True)
class CmRep:
    """``ib_cm_rep_t``: the answer to a REQ (RC/UC), or a SIDR reply (UD).

    ``pdata`` is ``p_rep_pdata``/``rep_length``; ``qp`` (``h_qp``),
    ``access_ctrl``, ``sq_depth``/``rq_depth`` (0: unchanged), ``init_depth``
    (at most the REQ record's ``resp_res``), ``target_ack_delay``,
    ``failover_accepted``, ``flow_ctrl``, ``rnr_nak_timeout``,
    ``rnr_retry_cnt``; callbacks ``rej_cb`` ... ``dreq_cb``; ``recv_wrs``
    (``p_recv_wr``) are posted before the REP leaves (a failure raises, naming
    the first failed WR, instead of ``pp_recv_failure``).  UD: ``status``
    (``ib_sidr_status_t``), ``class_info`` (the redirect ClassPortInfo, bytes).
    """

    qp: Any = None
    flags: AlFlags = AlFlags.NONE
    pdata: bytes = b""
    qp_type: QpType = QpType.RC
    access_ctrl: AccessFlags = AccessFlags.NONE
    sq_depth: int = 0
    rq_depth: int = 0
    init_depth: int = 0
    target_ack_delay: int = 0
    failover_accepted: CmFailover = CmFailover.UNSUPPORTED
    flow_ctrl: bool = False
    rnr_nak_timeout: int = 12
    rnr_retry_cnt: int = 7
    rej_cb: Callable[..., Any] | None = None
    mra_cb: Callable[..., Any] | None = None
    rtu_cb: Callable[..., Any] | None = None
    lap_cb: Callable[..., Any] | None = None
    dreq_cb: Callable[..., Any] | None = None
    recv_wrs: tuple[Any, ...] = ()
    status: SidrStatus = SidrStatus.SUCCESS
    class_info: bytes = b""

    @property
    def sync(self) -> bool:
        return bool(self.flags & AlFlags.SYNC)

    @property
    def attr(self) -> CmAttr:
        return CmAttr.SIDR_REP if self.qp_type is QpType.UD else CmAttr.REP

    def validate(self, req: CmReqRec | None = None) -> None:
        """Checks alone, and against the REQ being answered when ``req`` is given."""
        _flags(self.flags)
        _qp_type(self.qp_type, (*_CONNECTED, QpType.UD))
        check_pdata(self.attr, self.pdata)
        if self.qp_type is QpType.UD:
            if not isinstance(self.status, int) or self.status not in set(SidrStatus):
                raise InvalidParameter(f"status {self.status!r} is not a SidrStatus")
            if self.status == SidrStatus.SUCCESS and self.qp is None:
                raise InvalidParameter("a SIDR reply with status SUCCESS names a qp")
            _info("class_info", self.class_info, APR_INFO_SIZE)
            return
        if self.qp is None:
            raise InvalidParameter("qp is required for an RC/UC reply")
        if not isinstance(self.access_ctrl, AccessFlags):
            raise InvalidParameter("access_ctrl must be ibal.types.AccessFlags")
        for name, bits in (("sq_depth", 32), ("rq_depth", 32), ("init_depth", 8),
                           ("target_ack_delay", 5), ("rnr_nak_timeout", 5),
                           ("rnr_retry_cnt", 3)):  # fmt: skip
            _uint(name, getattr(self, name), bits)
        if self.failover_accepted not in set(CmFailover):
            raise InvalidSetting(
                f"failover_accepted {self.failover_accepted!r} is not a CmFailover"
            )
        _bool("flow_ctrl", self.flow_ctrl)
        for cb in ("rej_cb", "mra_cb", "rtu_cb", "lap_cb", "dreq_cb"):
            _callable(cb, getattr(self, cb))
        if req is not None and self.init_depth > req.resp_res:
            raise InvalidSetting(
                f"init_depth is {self.init_depth}; at most the request's resp_res {req.resp_res}"
            )


@record(frozen=True, kw_only=True)
class CmRepRec:
    """``ib_cm_rep_rec_t``: a received REP (or SIDR_REP) as the REP callback sees it.

    ``cm_status`` is added (the seed has no field for the documented timeout:
    ``Status.TIMEOUT`` with no message).  ``cm_rep`` is ``h_cm_rep``;
    ``resp_res`` the replier's responder resources, which this side's QP
    gets as its initiator depth (it may be below the REQ's ``init_depth``);
    ``apr_status`` carries REP's FailoverAccepted.
    UD: ``sidr_context``, ``status``, ``remote_qp``, ``remote_qkey``,
    ``class_info``.
    """

    pdata: bytes = b""
    qp_type: QpType = QpType.RC
    cm_status: Status = Status.SUCCESS
    cm_rep: Any = None
    qp: Any = None
    qp_context: Any = None
    resp_res: int = 0
    flow_ctrl: bool = False
    apr_status: CmFailover = CmFailover.UNSUPPORTED
    sidr_context: Any = None
    status: SidrStatus = SidrStatus.SUCCESS
    remote_qp: int = 0
    remote_qkey: int = 0
    class_info: bytes = b""
    al: Any = None


# ------------------------------------------------------------------ RTU, REJ, MRA


@record(frozen=True, kw_only=True)
class CmRtu:
    """``ib_cm_rtu_t``: ``access_ctrl`` (None: unchanged), ``sq_depth``/``rq_depth``
    (0: unchanged), ``pdata`` (``p_rtu_pdata``/``rtu_length``), ``apr_cb``, ``dreq_cb``."""

    access_ctrl: AccessFlags | None = None
    sq_depth: int = 0
    rq_depth: int = 0
    pdata: bytes = b""
    apr_cb: Callable[..., Any] | None = None
    dreq_cb: Callable[..., Any] | None = None

    def validate(self) -> None:
        check_pdata(CmAttr.RTU, self.pdata)
        if self.access_ctrl is not None and not isinstance(self.access_ctrl, AccessFlags):
            raise InvalidParameter("access_ctrl must be ibal.types.AccessFlags")
        _uint("sq_depth", self.sq_depth, 32)
        _uint("rq_depth", self.rq_depth, 32)
        _callable("apr_cb", self.apr_cb)
        _callable("dreq_cb", self.dreq_cb)


@record(frozen=True, kw_only=True)
class CmRtuRec:
    """``ib_cm_rtu_rec_t`` (``p_rtu_pdata``, ``h_qp``, ``qp_context``) plus ``cm_status``:
    the seed documents a timeout status with no field to carry it."""

    pdata: bytes = b""
    qp: Any = None
    qp_context: Any = None
    cm_status: Status = Status.SUCCESS


@record(frozen=True, kw_only=True)
class CmRej:
    """``ib_cm_rej_t``: ``rej_status`` (a :class:`RejReason`), ``ari`` (``p_ari``/
    ``ari_length``, at most 72 bytes) and ``pdata`` (``p_rej_pdata``/``rej_length``)."""

    rej_status: RejReason | int = RejReason.CONSUMER_DEFINED
    ari: bytes = b""
    pdata: bytes = b""

    def validate(self) -> None:
        _uint("rej_status", self.rej_status, 16)
        _info("REJ additional reject information (ARI)", self.ari, ARI_SIZE)
        check_pdata(CmAttr.REJ, self.pdata)


@record(frozen=True, kw_only=True)
class CmRejRec:
    """``ib_cm_rej_rec_t``: ``rej_status``, ``ari`` (its ARI length long), ``pdata``,
    ``qp`` (``h_qp``), ``qp_context``."""

    rej_status: RejReason | int
    ari: bytes = b""
    pdata: bytes = b""
    qp: Any = None
    qp_context: Any = None


@record(frozen=True, kw_only=True)
class CmMra:
    """``ib_cm_mra_t``: ``svc_timeout`` (4.096 µs * 2^value the service needs) and
    ``pdata`` (``p_mra_pdata``/``mra_length``)."""

    svc_timeout: int = 0
    pdata: bytes = b""

    def validate(self) -> None:
        _uint("svc_timeout", self.svc_timeout, 5)
        check_pdata(CmAttr.MRA, self.pdata)


@record(frozen=True, kw_only=True)
class CmMraRec:
    """``ib_cm_mra_rec_t``: ``pdata`` (``p_mra_pdata``), ``qp``, ``qp_context``; added:
    ``svc_timeout``, the peer's service timeout."""

    pdata: bytes = b""
    qp: Any = None
    qp_context: Any = None
    svc_timeout: int = 0


# ------------------------------------------------------------------ DREQ, DREP


@record(frozen=True, kw_only=True)
class CmDreq:
    """``ib_cm_dreq_t``: ``flags``, ``pdata`` (``p_dreq_pdata``/``dreq_length``),
    ``qp_type``, ``qp`` (``h_qp``), ``drep_cb`` (``pfn_cm_drep_cb``)."""

    qp: Any = None
    flags: AlFlags = AlFlags.NONE
    pdata: bytes = b""
    qp_type: QpType = QpType.RC
    drep_cb: Callable[..., Any] | None = None

    @property
    def sync(self) -> bool:
        return bool(self.flags & AlFlags.SYNC)

    def validate(self) -> None:
        _flags(self.flags)
        _qp_type(self.qp_type, _CONNECTED)
        if self.qp is None:
            raise InvalidParameter("qp is required")
        _callable("drep_cb", self.drep_cb)
        check_pdata(CmAttr.DREQ, self.pdata)


@record(frozen=True, kw_only=True)
class CmDreqRec:
    """``ib_cm_dreq_rec_t``: ``cm_dreq`` (``h_cm_dreq``), ``pdata``, ``qp_context``."""

    pdata: bytes = b""
    cm_dreq: Any = None
    qp_context: Any = None


@record(frozen=True, kw_only=True)
class CmDrep:
    """``ib_cm_drep_t``: ``pdata`` (``p_drep_pdata``/``drep_length``)."""

    pdata: bytes = b""

    def validate(self) -> None:
        check_pdata(CmAttr.DREP, self.pdata)


@record(frozen=True, kw_only=True)
class CmDrepRec:
    """``ib_cm_drep_rec_t``: ``cm_status`` (SUCCESS: a DREP came; TIMEOUT: none did),
    ``pdata``, ``qp``, ``qp_context``."""

    cm_status: Status = Status.SUCCESS
    pdata: bytes = b""
    qp: Any = None
    qp_context: Any = None


# ------------------------------------------------------------------ LAP, APR


@record(frozen=True, kw_only=True)
class CmLap:
    """``ib_cm_lap_t``: ``flags``, ``pdata`` (``p_lap_pdata``/``lap_length``),
    ``qp_type``, ``qp``, ``remote_resp_timeout``, ``alt_path`` (``p_alt_path``),
    ``apr_cb``."""

    qp: Any = None
    alt_path: PathRec | None = None
    flags: AlFlags = AlFlags.NONE
    pdata: bytes = b""
    qp_type: QpType = QpType.RC
    remote_resp_timeout: int = 20
    apr_cb: Callable[..., Any] | None = None

    @property
    def sync(self) -> bool:
        return bool(self.flags & AlFlags.SYNC)

    def validate(self) -> None:
        _flags(self.flags)
        _qp_type(self.qp_type, _CONNECTED)
        if self.qp is None:
            raise InvalidParameter("qp is required")
        if self.alt_path is None:
            raise InvalidParameter("alt_path is required")
        check_path("alt_path", self.alt_path)
        _uint("remote_resp_timeout", self.remote_resp_timeout, 5)
        _callable("apr_cb", self.apr_cb, required=True)
        check_pdata(CmAttr.LAP, self.pdata)


@record(frozen=True, kw_only=True)
class CmLapRec:
    """``ib_cm_lap_rec_t``: ``cm_lap`` (``h_cm_lap``), ``alt_path`` (as this side
    sees it: ``sgid`` local), ``pdata``, ``qp_context``."""

    alt_path: PathRec
    pdata: bytes = b""
    cm_lap: Any = None
    qp_context: Any = None


@record(frozen=True, kw_only=True)
class CmApr:
    """``ib_cm_apr_t``: ``pdata`` (``p_apr_pdata``/``apr_length``), ``qp_type``, ``qp``,
    ``apr_status`` (``ib_apr_status_t``), ``info`` (``p_info``/``info_length``, at most 72)."""

    qp: Any = None
    apr_status: AprStatus = AprStatus.SUCCESS
    info: bytes = b""
    pdata: bytes = b""
    qp_type: QpType = QpType.RC

    def validate(self) -> None:
        _qp_type(self.qp_type, _CONNECTED)
        if self.qp is None:
            raise InvalidParameter("qp is required")
        _uint("apr_status", self.apr_status, 8)
        _info("APR additional information", self.info, APR_INFO_SIZE)
        check_pdata(CmAttr.APR, self.pdata)


@record(frozen=True, kw_only=True)
class CmAprRec:
    """``ib_cm_apr_rec_t``: ``cm_status`` (SUCCESS: loaded; TIMEOUT: no APR; other with
    ``apr_status`` SUCCESS: the local QP refused the path), ``apr_status``, ``info``,
    ``pdata``, ``qp``, ``qp_context``."""

    cm_status: Status = Status.SUCCESS
    apr_status: AprStatus | int = AprStatus.SUCCESS
    info: bytes = b""
    pdata: bytes = b""
    qp: Any = None
    qp_context: Any = None
