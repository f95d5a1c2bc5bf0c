"""The mock fabric's subnet administrator: SA MADs to the SM port's QP1, answered in process.

A SubnAdm (class 0x03, version 2) MAD that a port's QP1 sends to QP1 at the
SM LID comes here instead of to the SM port's own QP1 (the engine hands it
over, as it hands SMPs to the SMAs): requests, the RMPP ACKs of our
GetTable answers and the ReportResps of our Reports.  The answers go out
from the SM port's QP1 like any datagram.  Behaviour follows OpenSM
(``osm_sa*.c``, read for facts; see docs/mock-provider.md):

- Get with no record: ERR_NO_RECORDS; with more than one: ERR_TOO_MANY_RECORDS;
  GetTable with none: success, no record.  Errors echo the request with the
  status (Set/Get -> GetResp, GetTable -> GetTableResp with AttributeOffset 0).
- A component mask with bits past the record's components: ERR_REQ_INVALID.
- Every GetTableResp goes out with RMPP (:mod:`ibal.transport.rmpp` through
  :mod:`ibal.transport.rmpp_io`), retransmitted on the fabric clock until ACKed.
- Notices (traps 64/65 as ports enter and leave the subnet, 128 when a link
  changes state, 66/67 as multicast groups come and go) go to matching
  subscribers as Reports, resent every :attr:`SaAgent.report_timeout`
  seconds until a ReportResp, :attr:`SaAgent.report_retries` times.
- A malformed or forged SA MAD is dropped and counted in :attr:`SaAgent.stats`.

Threads: everything runs under the fabric lock (the engine calls in from a
verb, a timer, or a fabric method); nothing here blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ibal.clock import Clock
from ibal.providers.mock import sa_records as rec
from ibal.providers.mock.sa_state import Groups, Services, Subscriptions
from ibal.providers.mock.topology import Link, MockPort, Switch
from ibal.transport.rmpp import Complete, RmppSender
from ibal.transport.rmpp_io import Result, RmppTransfers
from ibal.types import QP1_WELL_KNOWN_QKEY
from ibal.wire.fields import FieldError, Table
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MAD_SIZE, MadStatus, Method, MgmtClass, SaAttr
from ibal.wire.mad.header import CLASS_PORT_INFO, SA_DATA, SA_HEADER_OFFSET, build
from ibal.wire.mad.rmpp import RmppHeader, RmppType, is_rmpp

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric

SA_CLASS_VERSION = 2
SA_HEADER_SIZE = 20
RESP_TIME_VALUE = 0x10
CPI_CAPABILITY_MASK = 0x2602  # what OpenSM's SA ClassPortInfo says (saquery CPI)
CPI_CAPABILITY_MASK2 = 0xB5E8
REPORT_TID_BASE = 0x02DAB000  # OpenSM numbers its Reports from here

_TABLES: dict[int, Table] = {
    SaAttr.NODE_RECORD: sa.NODE_RECORD,
    SaAttr.PORT_INFO_RECORD: sa.PORT_INFO_RECORD,
    SaAttr.LINK_RECORD: sa.LINK_RECORD,
    SaAttr.GUID_INFO_RECORD: sa.GUID_INFO_RECORD,
    SaAttr.PATH_RECORD: sa.PATH_RECORD,
    SaAttr.SERVICE_RECORD: sa.SERVICE_RECORD,
    SaAttr.MCMEMBER_RECORD: sa.MCMEMBER_RECORD,
    SaAttr.INFORM_INFO: sa.INFORM_INFO,
    SaAttr.INFORM_INFO_RECORD: sa.INFORM_INFO_RECORD,
}
_TOPOLOGY: dict[int, Callable[[MockFabric, rec.Subnet], list[bytes]]] = {
    SaAttr.NODE_RECORD: rec.node_records,
    SaAttr.PORT_INFO_RECORD: rec.port_info_records,
    SaAttr.LINK_RECORD: rec.link_records,
    SaAttr.GUID_INFO_RECORD: rec.guid_info_records,
}
_GETS = (Method.GET, Method.GET_TABLE)
ENHANCED_COMP_MASK = 1 << 31
"""Attribute modifier bit 31 of a PortInfoRecord Get/GetTable (IBA 1.2 errata, as OpenSM's
``is_enhanced_comp_mask``): the capability masks match bitwise (every bit asked is set in
the port's), not by equality; how clients find the ports with IsDeviceManagementSupported."""
_ENHANCED: dict[int, tuple[str, ...]] = {
    SaAttr.PORT_INFO_RECORD: ("capability_mask", "capability_mask2"),
}


def _attr_mod(mad: bytes) -> int:
    return int.from_bytes(mad[20:24], "big")
_UNSUPPORTED = MadStatus.METHOD_ATTR_UNSUPPORTED


class _Timer:
    """An engine timer (``EngineCore.call_at``) with the handle RmppTransfers expects."""

    __slots__ = ("alive", "args", "fn", "timer_gen")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.alive = True
        self.timer_gen = 0

    def fire(self) -> None:
        self.fn(*self.args)

    def cancel(self) -> bool:
        was, self.alive = self.alive, False
        return was


class _EngineClock:
    def __init__(self, fabric: MockFabric) -> None:
        self.fabric = fabric

    def now(self) -> float:
        return self.fabric.engine.now


class _EngineTimers:
    """The :class:`~ibal.transport.rmpp_io.Timers` shape over the fabric's timer heap."""

    def __init__(self, fabric: MockFabric) -> None:
        self.fabric = fabric
        self._clock = _EngineClock(fabric)

    @property
    def clock(self) -> Clock:
        return self._clock

    def call_at(self, when: float, fn: Callable[..., object], *args: Any,
                owner: Hashable | None = None) -> _Timer:  # fmt: skip
        t = _Timer(fn, args)
        self.fabric.engine.call_at(when, t)
        return t


class _Report:
    __slots__ = ("dlid", "left", "mad", "qpn", "timer")

    def __init__(self, mad: bytes, dlid: int, qpn: int, left: int) -> None:
        self.mad, self.dlid, self.qpn, self.left = mad, dlid, qpn, left
        self.timer: _Timer | None = None


class SaAgent:
    """The SA of the mock fabric's SM (``fabric.sa``)."""

    report_timeout = 0.2  # OpenSM's transaction timeout (200 ms) ...
    report_retries = 3  # ... and retries
    rmpp_timeout = 1.0
    rmpp_retries = 5

    def __init__(self, fabric: MockFabric) -> None:
        self.fabric = fabric
        self.enabled = True
        """Off: SA MADs reach the SM port's QP1 like any other (an SA of your own there)."""
        self.stats: Counter[str] = Counter()
        self.timers = _EngineTimers(fabric)
        self.rmpp = RmppTransfers(self.timers, self._rmpp_result, SA_HEADER_SIZE)
        self.services = Services(lambda: fabric.engine.now)
        self.groups = Groups(fabric.subnet_timeout, self._group_changed)
        self.subscriptions = Subscriptions()
        self._reports: dict[int, _Report] = {}
        self._report_tid = REPORT_TID_BASE
        self._swept: dict[int, tuple[MockPort, bytes]] = {}
        self._swept_gen = -1
        self._links: list[Link] = []

    # ============================================================ the engine's side
    def takes(self, dlid: int, mad: bytes | memoryview) -> bool:
        """Whether a QP1-to-QP1 datagram to ``dlid`` is for the SA."""
        if not self.enabled or len(mad) < 2 or mad[1] != MgmtClass.SUBN_ADM:
            return False
        port = self.fabric.sm.port
        return port is not None and port.lid <= dlid < port.lid + (1 << port.lmc)

    def receive(self, src: MockPort, mad: bytes, pkey: int) -> None:
        """An SA MAD from ``src`` (lock held): answer it, or drop and count it."""
        self.stats["received"] += 1
        sm_port = self.fabric.sm.port
        if sm_port is None or len(mad) != MAD_SIZE or mad[0] != 1:
            self.stats["dropped_malformed"] += 1
            return
        try:
            self._receive(sm_port, src, mad, pkey)
        except FieldError:
            self.stats["dropped_malformed"] += 1

    def _receive(self, sm_port: MockPort, src: MockPort, mad: bytes, pkey: int) -> None:
        method = mad[3]
        tid = int.from_bytes(mad[8:16], "big")
        if is_rmpp(mad):
            # ACK/STOP/ABORT of a GetTableResp of ours come back with the R bit flipped
            # (GetTable); no SA request spans MADs
            key = (src.lid, tid)
            if (method == Method.GET_TABLE and RmppHeader.of(mad).type != RmppType.DATA
                    and self.rmpp.state(key) is not None):  # fmt: skip
                self.rmpp.feed(key, mad, self._sender(sm_port, src.lid))
            else:
                self.stats["dropped_unexpected"] += 1
            return
        if method & 0x80:
            self._response_in(src, method, tid)
            return
        status, resp, records = self._answer(src, mad, method)
        self.stats["answered"] += 1
        if status == MadStatus.SUCCESS and method == Method.GET_TABLE:
            self._send_table(sm_port, src, resp, records, tid, pkey)
        else:
            self.fabric.engine.send_gsi(sm_port, src.lid, 1, resp, pkey, QP1_WELL_KNOWN_QKEY)

    def _response_in(self, src: MockPort, method: int, tid: int) -> None:
        if method == Method.REPORT_RESP:
            r = self._reports.get(tid)
            if r is not None and r.dlid == src.lid:
                del self._reports[tid]
                if r.timer is not None:
                    r.timer.cancel()
                self.stats["reports_acked"] += 1
                return
        self.stats["dropped_unexpected"] += 1

    # ============================================================ answering
    def _answer(self, src: MockPort, mad: bytes, method: int) -> tuple[int, bytes, list[bytes]]:
        """(status, response MAD, records) for request ``mad``."""
        attr = int.from_bytes(mad[16:18], "big")
        if mad[2] != SA_CLASS_VERSION:
            return self._error(mad, MadStatus.BAD_VERSION)
        if attr == SaAttr.CLASS_PORT_INFO:
            if method != Method.GET:
                return self._error(mad, MadStatus.METHOD_ATTR_UNSUPPORTED)
            return self._respond(mad, [self._class_port_info()], 0)
        table = _TABLES.get(attr)
        if table is None:
            known = method in (*_GETS, Method.SET, Method.DELETE)
            return self._error(mad, MadStatus.METHOD_ATTR_UNSUPPORTED if known
                               else MadStatus.METHOD_UNSUPPORTED)  # fmt: skip
        mask = int.from_bytes(mad[48:56], "big")
        if mask >> rec.component_count(table):
            return self._error(mad, MadStatus.SA_REQ_INVALID)
        vals = table.decode(mad[SA_DATA : SA_DATA + table.size])
        status, records = self._dispatch(src, mad, method, attr, table, vals, mask)
        if status != MadStatus.SUCCESS:
            return self._error(mad, status)
        if method != Method.GET_TABLE and not records:
            return self._error(mad, MadStatus.SA_NO_RECORDS)
        if method != Method.GET_TABLE and len(records) > 1:
            return self._error(mad, MadStatus.SA_TOO_MANY_RECORDS)
        size = rec.record_size(table)
        return self._respond(mad, [r.ljust(size, b"\0") for r in records], size // 8)

    def _dispatch(self, src: MockPort, mad: bytes, method: int, attr: int, table: Table,
                  vals: rec.Values, mask: int) -> tuple[int, list[bytes]]:  # fmt: skip
        self.sweep()
        if attr in _TOPOLOGY:
            if method not in _GETS:
                return MadStatus.METHOD_ATTR_UNSUPPORTED, []
            rows = _TOPOLOGY[attr](self.fabric, rec.Subnet(*self._subnet()))
            bitwise = _ENHANCED.get(attr, ()) if _attr_mod(mad) & ENHANCED_COMP_MASK else ()
            return MadStatus.SUCCESS, [r for r in rows if rec.matches(
                table, vals, table.decode(r), mask, bitwise=bitwise)]  # fmt: skip
        if attr == SaAttr.PATH_RECORD:
            if method not in _GETS:
                return MadStatus.METHOD_ATTR_UNSUPPORTED, []
            return self._paths(vals, mask)
        if attr == SaAttr.SERVICE_RECORD:
            svc = self.services
            if method == Method.SET:
                return svc.set(vals, mask)
            if method == Method.DELETE:
                return svc.delete(vals, mask)
            return svc.get(vals, mask) if method in _GETS else (_UNSUPPORTED, [])
        if attr == SaAttr.MCMEMBER_RECORD:
            return self._mcmember(src, mad, method, vals, mask)
        if attr == SaAttr.INFORM_INFO:
            if method != Method.SET:
                return MadStatus.METHOD_ATTR_UNSUPPORTED, []
            status = self.subscriptions.set(vals, src.gid.packed, src.lid)
            return status, [sa.INFORM_INFO.encode(vals)] if status == MadStatus.SUCCESS else []
        if method not in _GETS:  # InformInfoRecord
            return MadStatus.METHOD_ATTR_UNSUPPORTED, []
        return MadStatus.SUCCESS, self.subscriptions.records(vals, mask)

    def _subnet(self) -> tuple[list[MockPort], list[tuple[Switch, int]]]:
        net = rec.sweep(self.fabric)
        return net.ports, net.switches

    def _paths(self, vals: rec.Values, mask: int) -> tuple[int, list[bytes]]:
        net = rec.sweep(self.fabric)
        ends = net.endpoints()
        bits = rec.mask_bits(sa.PATH_RECORD)

        def pick(gid_name: str, lid_name: str) -> list[rec.Node] | int:
            if mask & bits[gid_name]:
                gid = bytes(vals[gid_name])
                found = [n for n in ends if rec.gid_of(self.fabric, n) == gid]
                return found or MadStatus.SA_INVALID_GID
            if mask & bits[lid_name]:
                lid = int(vals[lid_name])
                found = [n for n in ends if n.lid == lid]
                return found or MadStatus.SA_REQ_INVALID
            return ends

        srcs, dsts = pick("sgid", "slid"), pick("dgid", "dlid")
        if isinstance(srcs, int):
            return srcs, []
        if isinstance(dsts, int):
            return dsts, []
        limit = int(vals["numb_path"]) if mask & bits["numb_path"] else 0
        out = []
        for s in srcs:
            for d in dsts:
                pr = rec.path_record(self.fabric, s, d, vals, mask)
                if pr is not None:
                    out.append(pr)
        if limit and len(srcs) == 1 and len(dsts) == 1:
            out = out[:limit]
        return MadStatus.SUCCESS, out

    def _mcmember(self, src: MockPort, mad: bytes, method: int, vals: rec.Values, mask: int
                  ) -> tuple[int, list[bytes]]:
        if method == Method.SET:
            gid = bytes(vals["port_gid"])
            port = next((p for p in rec.sweep(self.fabric).ports if p.gid.packed == gid), None)
            if port is None and mask & rec.mask_bits(sa.MCMEMBER_RECORD)["port_gid"]:
                return MadStatus.SA_REQ_INVALID, []
            return self.groups.join(vals, mask, int(port.max_mtu) if port else 4)
        if method == Method.DELETE:
            return self.groups.leave(vals, mask)
        if method in _GETS:
            sm_key = int.from_bytes(mad[SA_HEADER_OFFSET : SA_HEADER_OFFSET + 8], "big")
            trusted = sm_key == self.fabric.sm.sm_key
            return self.groups.get(vals, mask, src.gid.packed, trusted)
        return MadStatus.METHOD_ATTR_UNSUPPORTED, []

    def _class_port_info(self) -> bytes:
        return CLASS_PORT_INFO.encode(
            base_version=1, class_version=SA_CLASS_VERSION, capability_mask=CPI_CAPABILITY_MASK,
            capability_mask2=CPI_CAPABILITY_MASK2, resp_time_value=RESP_TIME_VALUE,
            redirect_qp=1, redirect_q_key=QP1_WELL_KNOWN_QKEY, trap_q_key=QP1_WELL_KNOWN_QKEY,
        )  # fmt: skip

    @staticmethod
    def _error(mad: bytes, status: int) -> tuple[int, bytes, list[bytes]]:
        """OpenSM's error answer: the request echoed with the status."""
        out = bytearray(mad)
        method = out[3]
        out[3] = (Method.GET if method == Method.SET else method) | 0x80
        out[4:6] = int(status).to_bytes(2, "big")
        out[SA_HEADER_OFFSET : SA_HEADER_OFFSET + 8] = bytes(8)  # SM_Key 0 (C15-0.1.5)
        if method == Method.GET_TABLE:
            out[44:46] = bytes(2)
        return status, bytes(out), []

    @staticmethod
    def _respond(mad: bytes, records: list[bytes], attr_offset: int
                 ) -> tuple[int, bytes, list[bytes]]:
        """The answer's header (SA header kept, SM_Key 0, AttributeOffset), one record in."""
        method = mad[3]
        out = bytearray(mad[:SA_DATA]) + bytearray(MAD_SIZE - SA_DATA)
        out[3] = (Method.GET if method == Method.SET else method) | 0x80
        out[4:6] = bytes(2)
        out[SA_HEADER_OFFSET : SA_HEADER_OFFSET + 8] = bytes(8)
        out[44:46] = (attr_offset if records else 0).to_bytes(2, "big")
        if records and method != Method.GET_TABLE:
            out[SA_DATA : SA_DATA + len(records[0])] = records[0]
        return MadStatus.SUCCESS, bytes(out), records

    # ============================================================ sending
    def _sender(self, sm_port: MockPort, dlid: int) -> Callable[[bytes], None]:
        engine = self.fabric.engine

        def send(m: bytes) -> None:
            engine.send_gsi(sm_port, dlid, 1, m, 0xFFFF, QP1_WELL_KNOWN_QKEY)

        return send

    def _send_table(self, sm_port: MockPort, src: MockPort, resp: bytes, records: list[bytes],
                    tid: int, pkey: int) -> None:  # fmt: skip
        key = (src.lid, tid)
        if self.rmpp.state(key) is not None:
            self.stats["dropped_duplicate"] += 1  # a retry while the answer is on its way
            return
        engine = self.fabric.engine

        def send(m: bytes) -> None:
            engine.send_gsi(sm_port, src.lid, 1, m, pkey, QP1_WELL_KNOWN_QKEY)

        sender = RmppSender(
            header=resp[:24], data=b"".join(records),
            class_header=resp[SA_HEADER_OFFSET:SA_DATA], resp_timeout=self.rmpp_timeout,
            retries=self.rmpp_retries, resp_time=RESP_TIME_VALUE & 0x1F,
        )  # fmt: skip
        self.stats["tables_sent"] += 1
        self.rmpp.send(key, sender, send)

    def _rmpp_result(self, key: Hashable, result: Result) -> None:
        self.stats["tables_acked" if isinstance(result, Complete) else "tables_failed"] += 1

    # ============================================================ notices
    def note_link(self, link: Link) -> None:
        """A link changed state (fabric lock held): trap 128 from each switch end, at
        the next :meth:`sweep`."""
        self._links.append(link)

    def sweep(self) -> bool:
        """Bring the SA's view up to the topology and report what changed (lock held);
        whether Reports went out."""
        gen = self.fabric.engine.topo_gen
        if gen == self._swept_gen or not self.enabled:
            return False
        sent = self.stats["reports_sent"]
        self._swept_gen = gen
        links, self._links = self._links, []
        net = rec.sweep(self.fabric)
        now = {p.guid: (p, p.gid.packed) for p in net.ports}
        old, self._swept = self._swept, now
        swept = {id(sw) for sw, _ in net.switches}
        for link in links:
            for end in (link.a, link.b):
                if isinstance(end, Switch) and id(end) in swept:
                    self._trap128(end)
        for guid, (_, gid) in old.items():
            if guid not in now:
                self._notice_gid(65, gid)
                self.subscriptions.drop_port(gid)
                self.groups.drop_port(gid)
        for guid, (_, gid) in now.items():
            if guid not in old:
                self._notice_gid(64, gid)
        return self.stats["reports_sent"] != sent

    def _sm_identity(self) -> tuple[int, bytes]:
        port = self.fabric.sm.port
        return (0, bytes(16)) if port is None else (port.lid, port.gid.packed)

    def _notice_gid(self, trap: int, gid: bytes) -> None:
        lid, sm_gid = self._sm_identity()
        details = sa.TRAP_64_65_DETAILS.encode(gid=gid)
        self.notify(sa.NOTICE.encode(is_generic=1, type=3, producer_type=4, trap_number=trap,
                                     issuer_lid=lid, data_details=details, issuer_gid=sm_gid))

    def _group_changed(self, trap: int, mgid: bytes) -> None:
        self._notice_gid(trap, mgid)

    def _trap128(self, sw: Switch) -> None:
        details = sa.TRAP_128_DETAILS.encode(lid=sw.lid)
        self.notify(sa.NOTICE.encode(
            is_generic=1, type=1, producer_type=2, trap_number=128, issuer_lid=sw.lid,
            data_details=details, issuer_gid=rec.gid_of(self.fabric, sw),
        ))  # fmt: skip

    def notify(self, notice: bytes) -> None:
        """Send ``notice`` (a Notice attribute) to every matching subscriber (lock held)."""
        sm_port = self.fabric.sm.port
        if sm_port is None:
            return
        fields = sa.NOTICE.decode(notice)
        self.stats["notices"] += 1
        for sub in list(self.subscriptions.subs):
            if not sub.wants(fields):
                continue
            self._report_tid = (self._report_tid + 1) & 0xFFFF_FFFF or 1
            tid = self._report_tid
            mad = bytes(build(MgmtClass.SUBN_ADM, Method.REPORT, SaAttr.NOTICE, tid=tid,
                              data=notice))  # fmt: skip
            r = self._reports[tid] = _Report(mad, sub.lid, sub.qpn, self.report_retries)
            self._send_report(tid, r)

    def _send_report(self, tid: int, r: _Report) -> None:
        sm_port = self.fabric.sm.port
        if sm_port is None:
            self._reports.pop(tid, None)
            return
        self.stats["reports_sent"] += 1
        self.fabric.engine.send_gsi(sm_port, r.dlid, r.qpn, r.mad, 0xFFFF, QP1_WELL_KNOWN_QKEY)
        r.timer = self.timers.call_at(self.fabric.engine.now + self.report_timeout,
                                      self._report_timeout, tid)  # fmt: skip

    def _report_timeout(self, tid: int) -> None:
        r = self._reports.get(tid)
        if r is None:
            return
        if r.left <= 0:
            del self._reports[tid]
            self.stats["reports_failed"] += 1
            return
        r.left -= 1
        self._send_report(tid, r)

    @property
    def pending_reports(self) -> int:
        return len(self._reports)

