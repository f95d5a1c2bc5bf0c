"""SA queries: IBAL's ``ib_query`` shape and a Pythonic layer over :class:`~ibal.sa.SaPort`.

IBAL shape::

    q = query(al, QueryReq(QueryType.NODE_REC_BY_NODE_GUID, node_guid, port_guid=pg,
                           callback=done))      # done(QueryRec) once, on the misc queue
    q.cancel()                                   # ib_cancel_query: done() still runs, CANCELED
    get_query_node_rec(rec.result_mad, 0)        # record 0, decoded (attr_id checked)

``flags=AlFlags.SYNC`` blocks until the callback has run.  Pythonic::

    node_records(al, lid=3)                      # [Record], blocking; raises on failure
    node_records(al, lid=3, callback=fn)         # Query; fn(QueryResult) later
    await node_records_async(al, lid=3)          # [Record]

Table queries use SubnAdmGetTable (a missing record is an empty list).  On an
RMPP-less transport (ibsim) a table answer longer than one MAD raises
``Error``: it was cut, and a short list would lie.
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ibal.al import AccessLayer, StashKey, call_user, in_callback
from ibal.sa.port import SaPort, SaRequest
from ibal.sa.txn import SA_DATA, SaAnswer
from ibal.status import (
    Error,
    InvalidAlHandle,
    InvalidIndex,
    InvalidParameter,
    InvalidState,
    RemoteError,
    Status,
    Timeout,
    error_class,
)
from ibal.types import AlFlags, Gid, is_int
from ibal.wire.fields import F, FieldError, Kind, Table
from ibal.wire.mad import header as mad_header
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr

__all__ = [
    "GidPair", "GuidPair", "LidPair", "Query", "QueryRec", "QueryReq", "QueryResult",
    "QueryType", "Record", "Selector", "UserQuery", "cancel_query", "get_query_node_rec",
    "get_query_path_rec", "get_query_portinfo_rec", "get_query_result", "get_query_svc_rec",
    "node_records", "node_records_async", "path_records", "path_records_async",
    "port_info_records", "port_info_records_async", "query", "service_records",
    "service_records_async", "user_query", "user_query_async",
]  # fmt: skip


class QueryType(enum.IntEnum):
    """``ib_query_type_t`` (IBAL's ordinals)."""

    USER_DEFINED = 0
    ALL_SVC_RECS = 1
    SVC_REC_BY_NAME = 2
    SVC_REC_BY_ID = 3
    CLASS_PORT_INFO = 4
    NODE_REC_BY_NODE_GUID = 5
    PORT_REC_BY_LID = 6
    VLARB_BY_LID_PORT_BLOCK = 7
    SLVL_BY_LID_AND_PORTS = 8
    PATH_REC_BY_PORT_GUIDS = 9
    PATH_REC_BY_GIDS = 10
    PATH_REC_BY_LIDS = 11


@dataclass(frozen=True)
class GuidPair:
    """``ib_guid_pair_t``: source and destination port GUIDs."""

    src_guid: int
    dest_guid: int


@dataclass(frozen=True)
class GidPair:
    """``ib_gid_pair_t``."""

    src_gid: Gid | str
    dest_gid: Gid | str


@dataclass(frozen=True)
class LidPair:
    """``ib_lid_pair_t``."""

    src_lid: int
    dest_lid: int


@dataclass(frozen=True)
class UserQuery:
    """``ib_user_query_t``: any SA attribute, method and component mask.

    ``attr`` is the record as bytes (``p_attr``); ``attr_size`` its size (0: ``len(attr)``).
    """

    method: int
    attr_id: int
    attr_size: int = 0
    comp_mask: int = 0
    attr: bytes = b""


@dataclass(frozen=True)
class QueryRec:
    """``ib_query_rec_t``: what the query callback gets.

    ``result_mad`` (the SA's whole, reassembled answer, as bytes: Python owns it,
    there is no ``ib_put_mad``) is set for ``SUCCESS`` and ``REMOTE_ERROR``.
    """

    context: Any
    status: Status
    query_type: QueryType
    result_cnt: int
    result_mad: bytes | None
    detail: str = ""


QueryCallback = Callable[[QueryRec], object]


@dataclass
class QueryReq:
    """``ib_query_req_t``.

    ``query_input`` depends on ``query_type``: a :class:`UserQuery`; nothing; a
    service name (str/bytes, at most 64 bytes); a service ID; nothing; a node
    GUID; a base LID; ``(lid, out_port, block)``; ``(lid, in_port, out_port)``;
    a :class:`GuidPair`, :class:`GidPair` or :class:`LidPair`.
    """

    query_type: QueryType | int
    query_input: Any = None
    port_guid: int | None = None
    timeout_ms: int = 1000
    retry_cnt: int = 3
    flags: AlFlags | int = AlFlags.NONE
    query_context: Any = None
    callback: QueryCallback | None = None


class Query:
    """``ib_query_handle_t``: a query in flight."""

    def __init__(self, req: QueryReq, qtype: QueryType) -> None:
        self.req = req
        self.query_type = qtype
        self._sa: SaRequest | None = None
        self._ran = threading.Event()
        self.rec: QueryRec | None = None

    def _answered(self, answer: SaAnswer) -> None:
        has_mad = answer.status in (Status.SUCCESS, Status.REMOTE_ERROR) and bool(answer.mad)
        self.rec = QueryRec(self.req.query_context, answer.status, self.query_type,
                            len(answer.records), answer.mad if has_mad else None,
                            answer.detail)  # fmt: skip
        try:
            if self.req.callback is not None:
                call_user(self.req.callback, self.rec)
        finally:
            self._ran.set()

    @property
    def done(self) -> bool:
        """The callback has run."""
        return self._ran.is_set()

    def cancel(self) -> None:
        """``ib_cancel_query``: the callback still runs once (``CANCELED`` unless it ended)."""
        if self._sa is not None:
            self._sa.cancel()

    def wait(self, timeout: float | None = None) -> QueryRec:
        """Block until the callback ran; its :class:`QueryRec`."""
        if not self._ran.wait(timeout):
            raise Timeout(f"the query did not end within {timeout} s")
        assert self.rec is not None
        return self.rec


def cancel_query(al: AccessLayer, h_query: Query) -> None:
    """``ib_cancel_query(h_al, h_query)`` (returns nothing)."""
    if not isinstance(al, AccessLayer):
        raise InvalidAlHandle("expected an AL handle")
    if isinstance(h_query, Query):
        h_query.cancel()


# ---------------------------------------------------------------- building requests

_PR_GIDS = sa.component_mask(sa.PATH_RECORD, ["sgid", "dgid"])


def _gid_bytes(g: Gid | str | bytes) -> bytes:
    try:
        if isinstance(g, bytes | bytearray):
            if len(g) != 16:
                raise ValueError
            return bytes(g)
        return Gid(g).packed
    except ValueError:
        raise InvalidParameter(f"{g!r} is not a GID") from None


def _port_gid(port: SaPort, guid: int) -> bytes:
    """The GID of port ``guid`` on this subnet: our port's prefix, the GUID below."""
    gids = port.ca.query_port(port.port_num).gids
    prefix = gids[0].packed[:8] if gids else bytes.fromhex("fe80000000000000")
    return prefix + guid.to_bytes(8, "big")


def _u(v: object, bits: int, what: str) -> int:
    if not is_int(v) or not 0 <= v < 1 << bits:
        raise InvalidParameter(f"{what} must be a {bits}-bit int, not {v!r}")
    return v


def _triple(v: object, what: str) -> tuple[int, int, int]:
    if not isinstance(v, tuple) or len(v) != 3:
        raise InvalidParameter(f"{what} takes a (lid, port, port/block) tuple")
    return _u(v[0], 16, "lid"), _u(v[1], 8, "port"), _u(v[2], 8, what)


def _enc(table: Table, **values: Any) -> tuple[bytes, int]:
    try:
        return table.encode(**values), sa.component_mask(table, values)
    except FieldError as exc:
        raise InvalidParameter(str(exc)) from None


def _service_name(v: object) -> bytes:
    raw = v.encode() if isinstance(v, str) else v
    if not isinstance(raw, bytes) or len(raw) > 64:
        raise InvalidParameter("a service name is str or bytes of at most 64 bytes")
    return raw.ljust(64, b"\0")


def _request(port: SaPort, qtype: QueryType, inp: Any) -> tuple[int, int, bytes, int]:
    """(method, attr_id, record, comp_mask) for a typed query."""
    T = Method.GET_TABLE
    if qtype is QueryType.USER_DEFINED:
        if not isinstance(inp, UserQuery):
            raise InvalidParameter("USER_DEFINED takes a UserQuery")
        attr = bytes(inp.attr[: inp.attr_size] if inp.attr_size else inp.attr)
        return (_u(inp.method, 8, "method"), _u(inp.attr_id, 16, "attr_id"), attr,
                _u(inp.comp_mask, 64, "comp_mask"))  # fmt: skip
    if qtype is QueryType.ALL_SVC_RECS:
        return T, SaAttr.SERVICE_RECORD, b"", 0
    if qtype is QueryType.SVC_REC_BY_NAME:
        return T, SaAttr.SERVICE_RECORD, *_enc(sa.SERVICE_RECORD, service_name=_service_name(inp))
    if qtype is QueryType.SVC_REC_BY_ID:
        return T, SaAttr.SERVICE_RECORD, *_enc(sa.SERVICE_RECORD,
                                               service_id=_u(inp, 64, "service id"))
    if qtype is QueryType.CLASS_PORT_INFO:
        return Method.GET, SaAttr.CLASS_PORT_INFO, b"", 0
    if qtype is QueryType.NODE_REC_BY_NODE_GUID:
        return T, SaAttr.NODE_RECORD, *_enc(sa.NODE_RECORD, node_guid=_u(inp, 64, "node GUID"))
    if qtype is QueryType.PORT_REC_BY_LID:
        return T, SaAttr.PORT_INFO_RECORD, *_enc(sa.PORT_INFO_RECORD,
                                                 endport_lid=_u(inp, 16, "LID"))
    if qtype is QueryType.VLARB_BY_LID_PORT_BLOCK:
        lid, port_, block = _triple(inp, "block")
        return T, SaAttr.VL_ARB_RECORD, *_enc(sa.VL_ARB_RECORD, lid=lid, output_port_num=port_,
                                              block_num=block)
    if qtype is QueryType.SLVL_BY_LID_AND_PORTS:
        lid, in_port, out_port = _triple(inp, "out port")
        return T, SaAttr.SL_TO_VL_RECORD, *_enc(sa.SL_TO_VL_RECORD, lid=lid,
                                                input_port_num=in_port, output_port_num=out_port)
    if qtype is QueryType.PATH_REC_BY_PORT_GUIDS:
        if not isinstance(inp, GuidPair):
            raise InvalidParameter("PATH_REC_BY_PORT_GUIDS takes a GuidPair")
        s, d = _u(inp.src_guid, 64, "src_guid"), _u(inp.dest_guid, 64, "dest_guid")
        return T, SaAttr.PATH_RECORD, sa.PATH_RECORD.encode(
            sgid=_port_gid(port, s), dgid=_port_gid(port, d)), _PR_GIDS
    if qtype is QueryType.PATH_REC_BY_GIDS:
        if not isinstance(inp, GidPair):
            raise InvalidParameter("PATH_REC_BY_GIDS takes a GidPair")
        return T, SaAttr.PATH_RECORD, sa.PATH_RECORD.encode(
            sgid=_gid_bytes(inp.src_gid), dgid=_gid_bytes(inp.dest_gid)), _PR_GIDS
    if not isinstance(inp, LidPair):
        raise InvalidParameter("PATH_REC_BY_LIDS takes a LidPair")
    return T, SaAttr.PATH_RECORD, *_enc(sa.PATH_RECORD, slid=_u(inp.src_lid, 16, "src_lid"),
                                        dlid=_u(inp.dest_lid, 16, "dest_lid"))


def query(al: AccessLayer, req: QueryReq) -> Query:
    """``ib_query``: start ``req``; its callback gets a :class:`QueryRec` exactly once.

    ``InvalidAlHandle``, ``InvalidParameter`` (bad request or input), ``Error``
    (unknown query type), ``InvalidGuid`` (no local port has ``port_guid``).  With
    ``AlFlags.SYNC`` the call returns after the callback ran (``InvalidState`` on an
    AL callback thread, which that wait would block).
    """
    if not isinstance(al, AccessLayer) or al.closed:
        raise InvalidAlHandle("ib_query needs an open AL")
    if not isinstance(req, QueryReq):
        raise InvalidParameter("ib_query takes a QueryReq")
    try:
        qtype = QueryType(req.query_type)
    except ValueError:
        raise Error(f"unknown query type {req.query_type!r}") from None
    if req.callback is not None and not callable(req.callback):
        raise InvalidParameter("the query callback must be callable")
    if not is_int(req.flags) or int(req.flags) & ~int(AlFlags.SYNC):
        raise InvalidParameter(f"bad flags {req.flags!r}")
    sync = bool(int(req.flags) & AlFlags.SYNC)
    if sync and in_callback():
        raise InvalidState("a SYNC query blocks: not on an AL callback thread")
    port = _port(al, req.port_guid)
    method, attr_id, data, mask = _request(port, qtype, req.query_input)
    q = Query(req, qtype)
    q._sa = port.request(method, attr_id, data, mask, timeout_ms=req.timeout_ms,
                         retry_cnt=req.retry_cnt, callback=_on_misc(al, q._answered))  # fmt: skip
    if sync:
        q.wait()
    return q


def _on_misc(al: AccessLayer, fn: Callable[[SaAnswer], None]) -> Callable[[SaAnswer], None]:
    """``fn`` as an :class:`SaPort` callback that runs on the misc queue, as the query
    API promises (the port calls back on its receive thread); queued straight, not
    dropped when something is dying, so the answer is delivered exactly once."""
    post = al.manager.queues.misc.post

    def hop(answer: SaAnswer) -> None:
        post(fn, answer)

    return hop


def _port(al: AccessLayer, port_guid: int | None) -> SaPort:
    """The AL's shared SaPort for the port; the query layer keeps one hold per port."""
    port = SaPort.open(al, port_guid)
    # Weak: a port that went (its CA withdrawn) must not stay referenced by the AL.
    held = al.stash.setdefault(_HELD, weakref.WeakSet())
    if port in held:
        port.close()  # already held by this layer: drop the extra hold
    else:
        held.add(port)
    return port


_HELD: StashKey[weakref.WeakSet[SaPort]] = StashKey()


# ---------------------------------------------------------------- reading results


def get_query_result(mad: bytes, index: int) -> bytes:
    """``ib_get_query_result``: record ``index`` of an SA answer (``attr_offset * 8`` bytes
    each); ``InvalidIndex`` past the end (IBAL asserts ``size*(i+1) + hdr <= len``)."""
    if not isinstance(mad, bytes | bytearray | memoryview) or len(mad) < SA_DATA:
        raise InvalidParameter("not an SA answer")
    step = int.from_bytes(mad[44:46], "big") * 8 or len(mad) - SA_DATA
    if not is_int(index) or index < 0 or SA_DATA + step * (index + 1) > len(mad):
        raise InvalidIndex(f"record {index!r} is past the answer's end")
    return bytes(mad[SA_DATA + step * index : SA_DATA + step * (index + 1)])


def _typed(mad: bytes, index: int, attr: SaAttr, table: Table) -> dict[str, Any]:
    if len(mad) < 24 or mad_header.header(mad).attr_id != attr:
        raise InvalidParameter(f"the answer is not a {table.name} answer")
    return table.decode(get_query_result(mad, index)[: table.size])


def get_query_node_rec(mad: bytes, index: int) -> dict[str, Any]:
    """``ib_get_query_node_rec``: record ``index``, decoded (the answer must be NodeRecords)."""
    return _typed(mad, index, SaAttr.NODE_RECORD, sa.NODE_RECORD)


def get_query_path_rec(mad: bytes, index: int) -> dict[str, Any]:
    """``ib_get_query_path_rec``."""
    return _typed(mad, index, SaAttr.PATH_RECORD, sa.PATH_RECORD)


def get_query_portinfo_rec(mad: bytes, index: int) -> dict[str, Any]:
    """``ib_get_query_portinfo_rec``."""
    return _typed(mad, index, SaAttr.PORT_INFO_RECORD, sa.PORT_INFO_RECORD)


def get_query_svc_rec(mad: bytes, index: int) -> dict[str, Any]:
    """``ib_get_query_svc_rec``."""
    return _typed(mad, index, SaAttr.SERVICE_RECORD, sa.SERVICE_RECORD)


# ---------------------------------------------------------------- the Pythonic layer


class Record(Mapping[str, Any]):
    """One SA record: its fields by name (``rec.lid``, ``rec["lid"]``) and ``raw`` bytes."""

    __slots__ = ("_fields", "raw", "table")

    def __init__(self, table: Table, raw: bytes) -> None:
        self.table = table
        self.raw = raw
        self._fields: dict[str, Any] | None = None

    @property
    def fields(self) -> dict[str, Any]:
        if self._fields is None:
            self._fields = self.table.decode(self.raw[: self.table.size])
        return self._fields

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(f"{self.table.name} has no field {name!r}") from None

    def __iter__(self) -> Any:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"<{self.table.name} {self.fields}>"


@dataclass(frozen=True)
class QueryResult:
    """What a Pythonic query's callback gets."""

    status: Status
    records: list[Record] = field(default_factory=list)
    mad_status: int = 0
    detail: str = ""

    def unwrap(self) -> list[Record]:
        """The records, or the matching ``ibal.status`` error (``RemoteError`` has
        ``mad_status``); a Get the SA answers "no records" gives ``[]``."""
        if self.status is Status.SUCCESS:
            return self.records
        if self.status is Status.REMOTE_ERROR and self.mad_status == MadStatus.SA_NO_RECORDS:
            return []
        exc = error_class(self.status)(self.detail or self.status.name)
        if isinstance(exc, RemoteError):
            exc.mad_status = self.mad_status  # type: ignore[attr-defined]
        raise exc


@dataclass(frozen=True)
class _Spec:
    method: int
    attr_id: int
    data: bytes
    comp_mask: int
    table: Table | None


class PyQuery:
    """A Pythonic query in flight: ``cancel()``, ``wait()`` -> records, ``await``."""

    def __init__(self, request: SaRequest, table: Table | None) -> None:
        self._request = request
        self._table = table

    def cancel(self) -> None:
        self._request.cancel()

    def wait(self, timeout: float | None = None) -> list[Record]:
        return _result(self._request.wait(timeout), self._table).unwrap()

    def __await__(self) -> Generator[Any, None, list[Record]]:
        answer = yield from self._request.__await__()
        return _result(answer, self._table).unwrap()


def _result(a: SaAnswer, table: Table | None) -> QueryResult:
    t = table or _RAW
    recs = [Record(t, r) for r in a.records] if a.ok else []
    return QueryResult(a.status, recs, a.mad_status, a.detail)


_RAW = Table("record", [F("data", 8, kind=Kind.BYTES)], size=1)  # no table: raw bytes only

_TABLES: dict[int, Table] = {
    SaAttr.NODE_RECORD: sa.NODE_RECORD, SaAttr.PORT_INFO_RECORD: sa.PORT_INFO_RECORD,
    SaAttr.PATH_RECORD: sa.PATH_RECORD, SaAttr.SERVICE_RECORD: sa.SERVICE_RECORD,
    SaAttr.MCMEMBER_RECORD: sa.MCMEMBER_RECORD, SaAttr.LINK_RECORD: sa.LINK_RECORD,
    SaAttr.GUID_INFO_RECORD: sa.GUID_INFO_RECORD, SaAttr.INFORM_INFO_RECORD: sa.INFORM_INFO_RECORD,
    SaAttr.SL_TO_VL_RECORD: sa.SL_TO_VL_RECORD, SaAttr.VL_ARB_RECORD: sa.VL_ARB_RECORD,
}  # fmt: skip


def _start(al: AccessLayer, spec: _Spec, port_guid: int | None, timeout_ms: int,
           retry_cnt: int, callback: Callable[[QueryResult], object] | None) -> PyQuery:
    if not isinstance(al, AccessLayer) or al.closed:
        raise InvalidAlHandle("an open AL is required")
    port = _port(al, port_guid)

    def done(answer: SaAnswer) -> None:
        if callback is not None:
            callback(_result(answer, spec.table))

    req = port.request(spec.method, spec.attr_id, spec.data, spec.comp_mask,
                       timeout_ms=timeout_ms, retry_cnt=retry_cnt,
                       callback=_on_misc(al, done))  # fmt: skip
    return PyQuery(req, spec.table)


def _run(al: AccessLayer, spec: _Spec, port_guid: int | None, timeout_ms: int,
         retry_cnt: int, callback: Callable[[QueryResult], object] | None
         ) -> list[Record] | PyQuery:  # fmt: skip
    q = _start(al, spec, port_guid, timeout_ms, retry_cnt, callback)
    return q if callback is not None else q.wait()


class Selector(enum.IntEnum):
    """PathRecord/MCMemberRecord selectors (IBA 15.2.5.16): how a value is compared."""

    GREATER = 0
    LESS = 1
    EXACTLY = 2
    LARGEST = 3


Selected = int | tuple[Selector | int, int]


def _selected(values: dict[str, Any], name: str, v: Selected | None) -> None:
    if v is None:
        return
    sel, val = (Selector.EXACTLY, v) if is_int(v) else v  # type: ignore[misc]
    values[f"{name}_selector"] = int(sel)
    values[name] = int(val)


def _endpoint(port: SaPort, v: object, side: str) -> dict[str, Any]:
    """A LID (int up to 0xFFFF), a port GUID (a larger int) or a GID, as PathRecord fields."""
    if isinstance(v, Gid | str | bytes):
        return {f"{side}gid": _gid_bytes(v)}
    if is_int(v) and 0 < v <= 0xFFFF:
        return {f"{side}lid": v}
    if is_int(v) and 0xFFFF < v <= 0xFFFF_FFFF_FFFF_FFFF:
        return {f"{side}gid": _port_gid(port, v)}
    raise InvalidParameter(f"{side} must be a LID, a port GUID or a GID, not {v!r}")


def _path_spec(al: AccessLayer, port_guid: int | None, src: object, dst: object,
               **sel: Any) -> _Spec:  # fmt: skip
    port = _port(al, port_guid)
    values: dict[str, Any] = {**_endpoint(port, src, "s"), **_endpoint(port, dst, "d")}
    if sel.get("sl") is not None:
        values["sl"] = sel["sl"]
    if sel.get("pkey") is not None:
        values["p_key"] = sel["pkey"]
    if sel.get("num_path") is not None:
        values["numb_path"] = sel["num_path"]
    if sel.get("reversible") is not None:
        values["reversible"] = int(bool(sel["reversible"]))
    _selected(values, "mtu", sel.get("mtu"))
    _selected(values, "rate", sel.get("rate"))
    _selected(values, "packet_life_time", sel.get("packet_life"))
    data, mask = _enc(sa.PATH_RECORD, **values)
    return _Spec(Method.GET_TABLE, SaAttr.PATH_RECORD, data, mask, sa.PATH_RECORD)


def _node_spec(lid: int | None, guid: int | None) -> _Spec:
    values: dict[str, Any] = {}
    if lid is not None:
        values["lid"] = lid
    if guid is not None:
        values["node_guid"] = guid
    data, mask = _enc(sa.NODE_RECORD, **values)
    return _Spec(Method.GET_TABLE, SaAttr.NODE_RECORD, data, mask, sa.NODE_RECORD)


def _pir_spec(lid: int | None, port_num: int | None) -> _Spec:
    values: dict[str, Any] = {}
    if lid is not None:
        values["endport_lid"] = lid
    if port_num is not None:
        values["port_num"] = port_num
    data, mask = _enc(sa.PORT_INFO_RECORD, **values)
    return _Spec(Method.GET_TABLE, SaAttr.PORT_INFO_RECORD, data, mask, sa.PORT_INFO_RECORD)


def _sr_spec(name: str | bytes | None, service_id: int | None, gid: Any) -> _Spec:
    values: dict[str, Any] = {}
    if name is not None:
        values["service_name"] = _service_name(name)
    if service_id is not None:
        values["service_id"] = service_id
    if gid is not None:
        values["service_gid"] = _gid_bytes(gid)
    data, mask = _enc(sa.SERVICE_RECORD, **values)
    return _Spec(Method.GET_TABLE, SaAttr.SERVICE_RECORD, data, mask, sa.SERVICE_RECORD)


def _user_spec(method: int, attr_id: int, comp_mask: int, record: bytes) -> _Spec:
    _u(method, 8, "method")
    _u(attr_id, 16, "attr_id")
    _u(comp_mask, 64, "comp_mask")
    return _Spec(method, attr_id, bytes(record), comp_mask, _TABLES.get(attr_id))


Callback = Callable[[QueryResult], object] | None
_KW = ("port_guid", "timeout_ms", "retry_cnt")


def node_records(al: AccessLayer, lid: int | None = None, guid: int | None = None, *,
                 port_guid: int | None = None, timeout_ms: int = 1000, retry_cnt: int = 3,
                 callback: Callback = None) -> Any:  # fmt: skip
    """NodeRecords (all, by ``lid``, by node ``guid``): the list, or with ``callback`` a
    :class:`PyQuery` whose ``callback(QueryResult)`` runs on the misc queue."""
    return _run(al, _node_spec(lid, guid), port_guid, timeout_ms, retry_cnt, callback)


async def node_records_async(al: AccessLayer, lid: int | None = None, guid: int | None = None,
                             **kw: Any) -> list[Record]:  # fmt: skip
    return await _start(al, _node_spec(lid, guid), *_kwargs(kw), None)


def port_info_records(al: AccessLayer, lid: int | None = None, port_num: int | None = None, *,
                      port_guid: int | None = None, timeout_ms: int = 1000, retry_cnt: int = 3,
                      callback: Callback = None) -> Any:  # fmt: skip
    """PortInfoRecords (all, of the port with base ``lid``, ``port_num`` of a switch)."""
    return _run(al, _pir_spec(lid, port_num), port_guid, timeout_ms, retry_cnt, callback)


async def port_info_records_async(al: AccessLayer, lid: int | None = None,
                                  port_num: int | None = None, **kw: Any) -> list[Record]:
    return await _start(al, _pir_spec(lid, port_num), *_kwargs(kw), None)


def service_records(al: AccessLayer, name: str | bytes | None = None,
                    service_id: int | None = None, gid: Any = None, *,
                    port_guid: int | None = None, timeout_ms: int = 1000, retry_cnt: int = 3,
                    callback: Callback = None) -> Any:  # fmt: skip
    """ServiceRecords (all, or by name, ID, GID)."""
    return _run(al, _sr_spec(name, service_id, gid), port_guid, timeout_ms, retry_cnt, callback)


async def service_records_async(al: AccessLayer, name: str | bytes | None = None,
                                service_id: int | None = None, gid: Any = None,
                                **kw: Any) -> list[Record]:  # fmt: skip
    return await _start(al, _sr_spec(name, service_id, gid), *_kwargs(kw), None)


def path_records(al: AccessLayer, src: Any, dst: Any, *, sl: int | None = None,
                 mtu: Selected | None = None, rate: Selected | None = None,
                 packet_life: Selected | None = None, pkey: int | None = None,
                 num_path: int | None = None, reversible: bool | None = None,
                 port_guid: int | None = None, timeout_ms: int = 1000, retry_cnt: int = 3,
                 callback: Callback = None) -> Any:  # fmt: skip
    """PathRecords from ``src`` to ``dst`` (each a LID up to 0xFFFF, a port GUID above, or
    a GID).  ``mtu``/``rate``/``packet_life``: an encoded value (exactly) or
    ``(Selector, value)``; each given selector joins the component mask."""
    spec = _path_spec(al, port_guid, src, dst, sl=sl, mtu=mtu, rate=rate,
                      packet_life=packet_life, pkey=pkey, num_path=num_path,
                      reversible=reversible)  # fmt: skip
    return _run(al, spec, port_guid, timeout_ms, retry_cnt, callback)


async def path_records_async(al: AccessLayer, src: Any, dst: Any, **kw: Any) -> list[Record]:
    sel = {k: kw.pop(k) for k in list(kw) if k not in _KW}
    spec = _path_spec(al, kw.get("port_guid"), src, dst, **sel)
    return await _start(al, spec, *_kwargs(kw), None)


def user_query(al: AccessLayer, method: int, attr_id: int, comp_mask: int = 0,
               record: bytes = b"", *, port_guid: int | None = None, timeout_ms: int = 1000,
               retry_cnt: int = 3, callback: Callback = None) -> Any:  # fmt: skip
    """Any SA attribute, method and component mask; records decoded where ``ibal.wire.mad.sa``
    has the attribute's table (else ``Record.raw`` only)."""
    spec = _user_spec(method, attr_id, comp_mask, record)
    return _run(al, spec, port_guid, timeout_ms, retry_cnt, callback)


async def user_query_async(al: AccessLayer, method: int, attr_id: int, comp_mask: int = 0,
                           record: bytes = b"", **kw: Any) -> list[Record]:  # fmt: skip
    return await _start(al, _user_spec(method, attr_id, comp_mask, record), *_kwargs(kw), None)


def _kwargs(kw: dict[str, Any]) -> tuple[int | None, int, int]:
    unknown = set(kw) - set(_KW)
    if unknown:
        raise InvalidParameter(f"unknown arguments {sorted(unknown)}")
    return kw.get("port_guid"), kw.get("timeout_ms", 1000), kw.get("retry_cnt", 3)

