"""``ibal saquery``: infiniband-diags' ``saquery`` over :mod:`ibal.sa`.

The same query names and arguments (``NR [lid]``, ``PIR [[lid]/[port]/[options]]``,
``SR``, ``PR``, ``MCMR``, ``LR``, ``GIR``, ``IIR``, ``CPI``; ``-p``,
``--src-to-dst SRC:DST``, ``--sgid-to-dgid``, ``-N``, ``-c``, ``-S``, ``-I``,
``-x``, ``-s``, ``-g``, ``-m`` and the record selectors) and the same
dumps (:mod:`ibal.wire.mad.dump`), so the output diffs cleanly against saquery's.
As saquery, every record query is a SubnAdmGetTable, ClassPortInfo a
SubnAdmGet, and a LID argument may be a node name (found in all NodeRecords).

:func:`saquery` is a function of an ``ask`` callable (one SA request, its
records or :class:`SaqueryError`) and the parsed :class:`Options`;
:func:`port_asker` makes ``ask`` from an :class:`~ibal.sa.SaPort`.  An answer
cut short (ibsim carries no RMPP: a multi-MAD table arrives as its first MAD)
is an error, never a short list.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ibal.tools.common import ToolError
from ibal.wire.fields import Table
from ibal.wire.mad import dump, sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr

if TYPE_CHECKING:
    from ibal.al import AccessLayer
    from ibal.sa import SaPort

__all__ = ["QUERIES", "Command", "NodePrint", "Options", "Params", "SaqueryError", "parse_gid",
           "port_asker", "saquery", "strtoul"]  # fmt: skip

CLASS_PORT_INFO: Final = 0x0001
_ISSM_MOD: Final = 1 << 31  # PortInfoRecord GetTable of the ports with a CapabilityMask bit on
_IS_SM: Final = 1 << 1
_IS_SM_DISABLED: Final = 1 << 10


class SaqueryError(ToolError):
    """A query that failed: message on stderr, exit status 1."""


Ask = Callable[..., tuple[bytes, ...]]
"""``ask(method, attr_id, data=b"", comp_mask=0, attr_mod=0) -> records``."""


def strtoul(text: str) -> int:
    """C's ``strtoul(text, NULL, 0)``: 0x hex, 0 octal, else decimal, the longest
    prefix that reads (none: 0), as saquery reads its numbers."""
    s = text.strip()
    neg = s.startswith("-")
    s = s.lstrip("+-")
    base, digits = 10, "0123456789"
    if s[:2].lower() == "0x":
        base, digits, s = 16, "0123456789abcdef", s[2:]
    elif s.startswith("0"):
        base, digits = 8, "01234567"
    n = 0
    for c in s.lower():
        if c not in digits:
            break
        n = n * base + digits.index(c)
    return -n if neg else n


def parse_gid(text: str) -> bytes:
    """A GID in IPv6 notation (``inet_pton``); ``SaqueryError`` otherwise."""
    try:
        return ipaddress.IPv6Address(text).packed
    except ValueError:
        raise SaqueryError(f"invalid GID {text!r} (IPv6 notation)") from None


@dataclass
class Params:
    """saquery's query parameters, each with its "not given" value (which leaves the
    component out of the ComponentMask, as saquery does)."""

    service_id: int = 0
    sgid: bytes = bytes(16)
    dgid: bytes = bytes(16)
    gid: bytes = bytes(16)
    mgid: bytes = bytes(16)
    slid: int = 0
    dlid: int = 0
    mlid: int = 0
    flow_label: int = 0
    hop_limit: int = -1
    tclass: int = 0
    reversible: int = -1
    numb_path: int = -1
    pkey: int = 0
    qos_class: int = -1
    sl: int = -1
    mtu: int = 0  # selector in the top two bits, as saquery's -M 0x84
    rate: int = 0
    pkt_life: int = 0
    qkey: int = 0
    scope: int = 0
    join_state: int = 0
    proxy_join: int = -1


class Command(enum.Enum):
    QUERY = "query"
    NODE_RECORD = "node-record"  # -N and the name look-ups
    CLASS_PORT_INFO = "cpi"  # -c
    ISSM = "issm"  # -s
    MCGROUPS = "mcgroups"  # -g
    MCMEMBERS = "mcmembers"  # -m


class NodePrint(enum.Enum):
    ALL = "all"
    LID_ONLY = "lid"  # -L
    UNIQUE_LID_ONLY = "unique-lid"  # -l
    GUID_ONLY = "guid"  # -G
    ALL_DESC = "desc"  # -D
    NAME_OF_LID = "name-of-lid"  # -O
    NAME_OF_GUID = "name-of-guid"  # -U


@dataclass
class Options:
    """A parsed ``saquery`` command line."""

    args: Sequence[str] = ()
    query_type: int | None = None  # an attribute ID set by -p, -S, -I, -x, --src-to-dst
    command: Command = Command.QUERY
    node_print: NodePrint = NodePrint.ALL
    src_to_dst: str | None = None
    show_keys: bool = False
    params: Params = field(default_factory=Params)


# ------------------------------------------------------------------ requests


class _Request:
    """A record of ``table`` being filled in, with its ComponentMask."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.values: dict[str, int | bytes] = {}
        self.names: list[str] = []

    def set(self, given: bool, **values: int | bytes) -> None:
        if given:
            self.values.update(values)
            self.names.extend(values)

    def sel(self, val: int, name: str) -> None:
        """A value with its selector in the top two bits (saquery's -M/-R/pkt_lifetime)."""
        sel_name = "packet_life_time_selector" if name == "packet_life_time" else f"{name}_selector"
        self.set(bool(val), **{name: val & 0x3F, sel_name: (val >> 6) & 3})

    def encode(self) -> tuple[bytes, int]:
        data = bytes(self.table.encode(self.values))
        return data, sa.component_mask(self.table, self.names)


def _path_request(p: Params) -> _Request:
    r = _Request(sa.PATH_RECORD)
    r.set(p.service_id != 0, service_id=p.service_id)
    r.set(any(p.sgid), sgid=p.sgid)
    r.set(any(p.dgid), dgid=p.dgid)
    r.set(p.slid != 0, slid=p.slid)
    r.set(p.dlid != 0, dlid=p.dlid)
    r.set(p.hop_limit != -1, hop_limit=p.hop_limit & 0xFF)
    r.set(p.flow_label != 0, flow_label=p.flow_label & 0xFFFFF)
    r.set(p.tclass != 0, tclass=p.tclass)
    r.set(p.reversible != -1, reversible=p.reversible & 1)
    r.set(p.numb_path != -1, numb_path=p.numb_path & 0x7F)
    r.set(p.pkey != 0, p_key=p.pkey)
    r.set(p.sl != -1, sl=p.sl & 0xF)
    r.set(p.qos_class != -1, qos_class=p.qos_class & 0xFFF)
    r.sel(p.mtu, "mtu")
    r.sel(p.rate, "rate")
    r.sel(p.pkt_life, "packet_life_time")
    return r


def _mcmember_request(p: Params) -> _Request:
    r = _Request(sa.MCMEMBER_RECORD)
    r.set(any(p.mgid), mgid=p.mgid)
    r.set(any(p.gid), port_gid=p.gid)
    r.set(p.mlid != 0, mlid=p.mlid)
    r.set(p.qkey != 0, q_key=p.qkey)
    r.sel(p.mtu, "mtu")
    r.sel(p.rate, "rate")
    r.sel(p.pkt_life, "packet_life_time")
    r.set(p.tclass != 0, tclass=p.tclass)
    r.set(p.pkey != 0, p_key=p.pkey)
    r.set(p.sl != -1, sl=p.sl & 0xF)
    r.set(p.flow_label != 0, flow_label=p.flow_label & 0xFFFFF)
    r.set(p.hop_limit != -1, hop_limit=p.hop_limit & 0xFF)
    r.set(p.scope != 0, scope=p.scope & 0xF)
    r.set(p.join_state != 0, join_state=p.join_state & 0xF)
    r.set(p.proxy_join != -1, proxy_join=p.proxy_join & 1)
    return r


# ------------------------------------------------------------------ the tool


class _Run:
    """One saquery invocation: ``ask`` and the options."""

    def __init__(self, ask: Ask, opts: Options) -> None:
        self.ask = ask
        self.opts = opts
        self._nodes: tuple[bytes, ...] | None = None

    def table(self, attr: int, req: _Request | None = None, attr_mod: int = 0) -> tuple[bytes, ...]:
        if req is None:
            return self.ask(Method.GET_TABLE, attr, attr_mod=attr_mod)
        data, mask = req.encode()
        return self.ask(Method.GET_TABLE, attr, data, mask, attr_mod=attr_mod)

    def nodes(self) -> tuple[bytes, ...]:
        """Every NodeRecord (once)."""
        if self._nodes is None:
            self._nodes = self.table(SaAttr.NODE_RECORD)
        return self._nodes

    def lid(self, name: str) -> int:
        """saquery's ``get_lid``: a node name (its NodeDescription) or a LID."""
        if name[:1].isalpha():
            for rec in self.nodes():
                d = sa.NODE_RECORD.decode(rec)
                if _desc(d["node_string"]) == name:
                    return int(d["lid"])
            raise SaqueryError(f'Failed to find lid for "{name}"')
        val = strtoul(name)
        if not 0 < val <= 0xFFFF:
            raise SaqueryError(f'Invalid lid specified: "{name}"')
        return val

    def lid_and_ports(self, text: str) -> tuple[int, int, int]:
        """``lid[/a[/b]]`` -> (lid or 0, a or -1, b or -1)."""
        parts = text.split("/", 2)
        lid = self.lid(parts[0]) if parts[0] else 0
        rest = [strtoul(x) if x[:1].isdigit() else -1 for x in parts[1:]]
        rest += [-1] * (2 - len(rest))
        return lid, rest[0], rest[1]


def _desc(raw: object) -> str:
    b = bytes(raw) if isinstance(raw, bytes | bytearray | memoryview) else b""
    return b.split(b"\0", 1)[0].decode("ascii", "replace")


def _dump_all(recs: Sequence[bytes], fn: Callable[[bytes], str]) -> str:
    return "".join(fn(r) for r in recs)


def _q_nr(run: _Run, args: Sequence[str]) -> str:
    r = _Request(sa.NODE_RECORD)
    lid = run.lid_and_ports(args[0])[0] if args else 0
    r.set(lid != 0, lid=lid)
    return _dump_all(run.table(SaAttr.NODE_RECORD, r), dump.saquery_node_record)


def _q_pir(run: _Run, args: Sequence[str]) -> str:
    r = _Request(sa.PORT_INFO_RECORD)
    lid, port, options = run.lid_and_ports(args[0]) if args else (0, -1, -1)
    r.set(lid != 0, endport_lid=lid)
    r.set(port != -1, port_num=port & 0xFF)
    r.set(options != -1, options=options & 0xFF)
    show = run.opts.show_keys
    return _dump_all(run.table(SaAttr.PORT_INFO_RECORD, r),
                     lambda rec: dump.saquery_portinfo_record(rec, show_keys=show))  # fmt: skip


def _q_sr(run: _Run, args: Sequence[str]) -> str:
    show = run.opts.show_keys
    return _dump_all(run.table(SaAttr.SERVICE_RECORD),
                     lambda rec: dump.saquery_service_record(rec, show_keys=show))  # fmt: skip


def _q_pr(run: _Run, args: Sequence[str]) -> str:
    recs = run.table(SaAttr.PATH_RECORD, _path_request(run.opts.params))
    return _dump_all(recs, dump.saquery_path_record)


def _q_mcmr(run: _Run, args: Sequence[str]) -> str:
    recs = run.table(SaAttr.MCMEMBER_RECORD, _mcmember_request(run.opts.params))
    return _dump_all(recs, dump.saquery_mcmember_record)


def _q_lr(run: _Run, args: Sequence[str]) -> str:
    r = _Request(sa.LINK_RECORD)
    from_lid, from_port, _ = run.lid_and_ports(args[0]) if args else (0, -1, -1)
    to_lid, to_port, _ = run.lid_and_ports(args[1]) if len(args) > 1 else (0, -1, -1)
    r.set(from_lid != 0, from_lid=from_lid)
    r.set(from_port != -1, from_port=from_port & 0xFF)
    r.set(to_lid != 0, to_lid=to_lid)
    r.set(to_port != -1, to_port=to_port & 0xFF)
    return _dump_all(run.table(SaAttr.LINK_RECORD, r), dump.saquery_link_record)


def _q_gir(run: _Run, args: Sequence[str]) -> str:
    r = _Request(sa.GUID_INFO_RECORD)
    lid, block, _ = run.lid_and_ports(args[0]) if args else (0, -1, -1)
    r.set(lid != 0, lid=lid)
    r.set(block != -1, block_num=block & 0xFF)
    return _dump_all(run.table(SaAttr.GUID_INFO_RECORD, r), dump.saquery_guidinfo_record)


def _q_iir(run: _Run, args: Sequence[str]) -> str:
    r = _Request(sa.INFORM_INFO_RECORD)
    if args:
        r.set(True, subscriber_gid=parse_gid(args[0]))
    show = run.opts.show_keys
    return _dump_all(run.table(SaAttr.INFORM_INFO_RECORD, r),
                     lambda rec: dump.saquery_informinfo_record(rec, show_keys=show))  # fmt: skip


def _cpi(run: _Run) -> str:
    [data] = run.ask(Method.GET, CLASS_PORT_INFO)[:1] or [b""]
    if not data:
        raise SaqueryError("Failed to query SA:ClassPortInfo")
    return dump.saquery_class_port_info(data)


def _q_cpi(run: _Run, args: Sequence[str]) -> str:
    return _cpi(run)


Handler = Callable[[_Run, Sequence[str]], str]

QUERIES: Final[dict[str, tuple[str, int, Handler]]] = {
    "ClassPortInfo": ("CPI", CLASS_PORT_INFO, _q_cpi),
    "NodeRecord": ("NR", SaAttr.NODE_RECORD, _q_nr),
    "PortInfoRecord": ("PIR", SaAttr.PORT_INFO_RECORD, _q_pir),
    "InformInfoRecord": ("IIR", SaAttr.INFORM_INFO_RECORD, _q_iir),
    "LinkRecord": ("LR", SaAttr.LINK_RECORD, _q_lr),
    "ServiceRecord": ("SR", SaAttr.SERVICE_RECORD, _q_sr),
    "PathRecord": ("PR", SaAttr.PATH_RECORD, _q_pr),
    "MCMemberRecord": ("MCMR", SaAttr.MCMEMBER_RECORD, _q_mcmr),
    "GUIDInfoRecord": ("GIR", SaAttr.GUID_INFO_RECORD, _q_gir),
}
"""saquery's query names -> (alias, attribute ID, handler); the others saquery knows
(SL2VL, PKTR, VLAR, LFTR, MFTR, SWIR, SMIR) are refused with a message."""
_NOT_HERE: Final = {"sl2vltablerecord": "SL2VL", "pkeytablerecord": "PKTR",
                    "vlarbitrationtablerecord": "VLAR", "lftrecord": "LFTR",
                    "mftrecord": "MFTR", "switchinforecord": "SWIR",
                    "sminforecord": "SMIR"}  # fmt: skip


def find_query(name: str) -> tuple[str, int, Handler] | None:
    """The query named ``name`` or its alias (any case); ``SaqueryError`` for one
    saquery has that ibal saquery does not print."""
    low = name.lower()
    for full, q in QUERIES.items():
        if low in (full.lower(), q[0].lower()):
            return q
    if low in _NOT_HERE or low in {a.lower() for a in _NOT_HERE.values()}:
        raise SaqueryError(f"query {name} is not supported by ibal saquery")
    return None


def _print_node(rec: bytes, how: NodePrint) -> str:
    d = sa.NODE_RECORD.decode(rec)
    if how in (NodePrint.LID_ONLY, NodePrint.UNIQUE_LID_ONLY):
        return f"{int(d['lid'])}\n"
    if how is NodePrint.GUID_ONLY:
        return f"0x{int(d['port_guid']):016x}\n"
    if how in (NodePrint.NAME_OF_LID, NodePrint.NAME_OF_GUID):
        return f"{_desc(d['node_string'])}\n"
    return dump.saquery_node_record(rec)


def _node_records(run: _Run) -> str:
    """``-N``, ``-D``, ``-L``, ``-l``, ``-G``, ``-O``, ``-U``: all NodeRecords, filtered."""
    how, args = run.opts.node_print, run.opts.args
    out: list[str] = []
    if how is NodePrint.ALL_DESC:
        out.append('   LID "name"\n================\n')
    for rec in run.nodes():
        d = sa.NODE_RECORD.decode(rec)
        if how is NodePrint.ALL_DESC:
            if d["node_type"] == 1:
                out.append(f'{int(d["lid"]):6d}  "{_desc(d["node_string"])}"\n')
        elif how is NodePrint.NAME_OF_LID:
            if strtoul(args[0]) & 0xFFFF == d["lid"]:
                out.append(_print_node(rec, how))
        elif how is NodePrint.NAME_OF_GUID:
            if strtoul(args[0]) == d["port_guid"]:
                out.append(_print_node(rec, how))
        elif not args or args[0] == _desc(d["node_string"]):
            out.append(_print_node(rec, how))
            if how is NodePrint.UNIQUE_LID_ONLY:
                break
    return "".join(out)


def _issm(run: _Run) -> str:
    out = []
    for head, bit in (("IsSM ports\n", _IS_SM), ("\nIsSMdisabled ports\n", _IS_SM_DISABLED)):
        r = _Request(sa.PORT_INFO_RECORD)
        r.set(True, capability_mask=bit)
        recs = run.table(SaAttr.PORT_INFO_RECORD, r, attr_mod=_ISSM_MOD)
        out.append(head + _dump_all(recs, dump.saquery_portinfo_brief))
    return "".join(out)


def _mc_members(run: _Run) -> str:
    groups = run.table(SaAttr.MCMEMBER_RECORD)
    names: dict[int, str] = {}
    for rec in run.nodes():
        d = sa.NODE_RECORD.decode(rec)
        names.setdefault(int(d["port_guid"]), _desc(d["node_string"]))
    only = strtoul(run.opts.args[0]) if run.opts.args else None
    return "".join(dump.saquery_mcmember_member(r, names, only) for r in groups)


def saquery(ask: Ask, opts: Options) -> str:
    """What ``saquery`` prints for ``opts`` (the query answered through ``ask``)."""
    run = _Run(ask, opts)
    p = opts.params
    args = list(opts.args)
    how = opts.node_print
    if how in (NodePrint.LID_ONLY, NodePrint.UNIQUE_LID_ONLY, NodePrint.GUID_ONLY) and not args:
        raise SaqueryError("ERROR: name not specified")
    if how in (NodePrint.NAME_OF_LID, NodePrint.NAME_OF_GUID) and not args:
        raise SaqueryError(f"ERROR: {'lid' if how is NodePrint.NAME_OF_LID else 'guid'} "
                           "not specified")  # fmt: skip
    if how is NodePrint.NAME_OF_LID and not strtoul(args[0]) & 0xFFFF:
        raise SaqueryError("ERROR: lid invalid")
    handler: Handler | None = None
    if opts.query_type is None and opts.command is Command.QUERY:
        q = find_query(args[0]) if args else None
        if q is None:
            handler = _q_nr
        else:
            handler = q[2]
            args = args[1:]
    elif opts.command is Command.QUERY:
        handler = next(q[2] for q in QUERIES.values() if q[1] == opts.query_type)
    if opts.src_to_dst is not None:
        src, _, dst = opts.src_to_dst.partition(":")
        if src:
            p.slid = run.lid(src)
        if dst:
            p.dlid = run.lid(dst)
    if opts.command is Command.NODE_RECORD:
        run.opts = Options(args, opts.query_type, opts.command, how, opts.src_to_dst,
                           opts.show_keys, p)  # fmt: skip
        return _node_records(run)
    if opts.command is Command.CLASS_PORT_INFO:
        return _cpi(run)
    if opts.command is Command.ISSM:
        return _issm(run)
    if opts.command is Command.MCGROUPS:
        return _dump_all(run.table(SaAttr.MCMEMBER_RECORD), dump.saquery_mcmember_group)
    if opts.command is Command.MCMEMBERS:
        return _mc_members(run)
    assert handler is not None
    return handler(run, args)


# ------------------------------------------------------------------ I/O


def _status_text(status: int) -> str:
    try:
        return MadStatus(status).name
    except ValueError:
        return "unknown"


def port_asker(port: SaPort, timeout_ms: int = 1000, retry_cnt: int = 3) -> Ask:
    """``ask`` through ``port``: records of a successful answer, else ``SaqueryError``
    (no answer, the SA's error status, an answer cut short)."""
    from ibal.status import Status

    def ask(method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0,
            attr_mod: int = 0) -> tuple[bytes, ...]:  # fmt: skip
        a = port.request(method, attr_id, data, comp_mask, attr_mod=attr_mod,
                         timeout_ms=timeout_ms, retry_cnt=retry_cnt).wait()  # fmt: skip
        if a.status is Status.SUCCESS:
            return a.records
        if a.status is Status.REMOTE_ERROR:
            raise SaqueryError(f"ERROR: Query result returned 0x{a.mad_status:04x} "
                               f"({_status_text(a.mad_status)})")  # fmt: skip
        if a.status is Status.ERROR and a.mad:
            raise SaqueryError(f"Query SA failed: {a.detail}; not printing a partial "
                               "list")  # fmt: skip
        raise SaqueryError(f"Query SA failed: {a.detail or a.status.name}")

    return ask


def open_port(al: AccessLayer, ca_name: str | None, port_num: int | None) -> SaPort:
    """The SA port of ``-C CA -P PORT`` (name or GUID; default: the first active port)."""
    from ibal.sa import SaPort
    from ibal.status import IbError
    from ibal.types import LinkState

    guid: int | None = None
    if ca_name is not None or port_num is not None:
        seen = []
        for ca_guid in al.get_ca_guids():
            attr = al.query_ca_by_guid(ca_guid)
            ca = al.open_ca(ca_guid)
            name = ca.name
            ca.close(wait=True)
            if ca_name is not None and ca_name not in (name, f"{ca_guid:016x}", hex(ca_guid)):
                continue
            for p in attr.ports:
                seen.append(f"{name}/{p.port_num} {p.link_state.name}")
                if port_num is not None and p.port_num != port_num:
                    continue
                if port_num is None and p.link_state is not LinkState.ACTIVE:
                    continue
                guid = p.port_guid
                break
            if guid is not None:
                break
        if guid is None:
            which = "" if port_num is None else f" {port_num}"
            where = f"CA {ca_name}" if ca_name else "any CA"
            raise SaqueryError(f"no active port{which} on {where} (seen: "
                               f"{', '.join(seen) or 'no CA'})")  # fmt: skip
    try:
        return SaPort.open(al, guid)
    except IbError as exc:
        raise SaqueryError(f"Failed to bind to the SA: {exc}") from exc
