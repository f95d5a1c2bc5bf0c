"""IOC discovery's reach: the DM requester of a port and the SA phase of a sweep.

:class:`DmPort` is a local port's DEV_MGT MAD service (QP1 alias) that sends
the sweep's Gets and hands their answers back.  :class:`TargetSearch` finds a
sweep's :class:`~ibal.dm.sweep.Target` list:

* per active InfiniBand port, through the SA (``ibal.sa.SaPort``): the
  PortInfoRecords whose CapabilityMask has IsDeviceManagementSupported (a
  GetTable with the CapabilityMask component and attribute modifier bit 31,
  :data:`ENHANCED_COMP_MASK`: the SA matches the mask bitwise, as OpenSM's
  ``is_enhanced_comp_mask``), the NodeRecord of each (the unit's GUIDs, IDs,
  description), a PathRecord from the port's GID to the remote port's;
* per active Ethernet (RoCE) port, which has no SA: a path (``ibal.sa.roce``,
  same request) to each configured :class:`RocePeer`.

A failed listing (PortInfo or NodeRecords, or records without sense) makes
the port *blind* for the sweep (``blind``: what it reached before is kept); a
path not found loses that target only.  SA answers arrive on the MAD receive
thread; everything runs under the lock the owner passes and nothing blocks.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ibal.al import Ca, Dependent
from ibal.dm.sweep import Target
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.records import record
from ibal.sa.port import SaPort
from ibal.sa.txn import SaAnswer
from ibal.status import IbError, InvalidParameter
from ibal.types import (
    NODE_DESC_SIZE,
    Gid,
    GidType,
    Grh,
    IouInfo,
    LinkLayer,
    MadAddr,
    PortAttr,
    QpType,
    WcStatus,
)
from ibal.wire.fields import FieldError
from ibal.wire.mad import sa
from ibal.wire.mad.consts import Method, MgmtClass, SaAttr
from ibal.wire.mad.dm import DM_CLASS_VERSION
from ibal.wire.mad.smp import CapabilityMask

__all__ = ["ENHANCED_COMP_MASK", "PEERS_ENV", "DmPort", "RocePeer", "TargetSearch", "parse_peers",
           "source_gid"]

log = logging.getLogger("ibal.dm")

ENHANCED_COMP_MASK = 1 << 31
"""PortInfoRecord attribute modifier bit 31: CapabilityMask components match bitwise."""

_PIR_MASK = sa.component_mask(sa.PORT_INFO_RECORD, ["capability_mask"])
_NR_MASK = sa.component_mask(sa.NODE_RECORD, ["lid"])
_PR_MASK = sa.component_mask(sa.PATH_RECORD, ["sgid", "dgid"])
_DGID_MASK = sa.component_mask(sa.PATH_RECORD, ["dgid"])
_RECORD = {SaAttr.PORT_INFO_RECORD: sa.PORT_INFO_RECORD, SaAttr.NODE_RECORD: sa.NODE_RECORD,
           SaAttr.PATH_RECORD: sa.PATH_RECORD}  # fmt: skip

AnswerSink = Callable[[object, bytes], object]
"""``fn(token, mad)``: the answer to a Get sent with ``token`` (misc queue)."""


@record(frozen=True)
class RocePeer:
    """A RoCE peer to ask for I/O units (RoCE has no SA to list them).

    ``iou_guid``: the unit's GUID as reported (0: the GID's low 64 bits, the
    only identity the wire gives); ``desc``: its description.
    """

    gid: Gid
    iou_guid: int = 0
    desc: str = ""


PEERS_ENV = "IBAL_IOC_PEERS"
"""RoCE peers asked for I/O units when none are given: ``10.0.0.7,fd00::9=array`` (IPv4
addresses become IPv4-mapped GIDs; ``=desc`` names the unit)."""


def parse_peers(text: str) -> tuple[RocePeer, ...]:
    """:data:`PEERS_ENV`'s syntax as peers; ``InvalidParameter`` names a bad entry."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        addr, _, desc = item.partition("=")
        try:
            ip = ipaddress.ip_address(addr.strip())
        except ValueError:
            raise InvalidParameter(f"{PEERS_ENV}: {addr!r} is no IPv4/IPv6 address") from None
        gid = Gid(f"::ffff:{ip}") if ip.version == 4 else Gid(str(ip))
        out.append(RocePeer(gid, desc=desc.strip()))
    return tuple(out)


def source_gid(port: PortAttr, dgid: Gid) -> Gid | None:
    """The local GID a path to ``dgid`` starts at: GID 0 on InfiniBand; on RoCE the first
    GID of the same family (IPv4-mapped or not), RoCE v2 first (``None``: let the resolver
    take the route's source)."""
    if port.link_layer is LinkLayer.INFINIBAND:
        return port.gids[0] if port.gids else None
    v4 = dgid.ipv4_mapped is not None
    same = [e for e in port.gid_table if e.is_ipv4 == v4]
    same.sort(key=lambda e: (e.gid_type is not GidType.ROCE_V2, e.index))
    return same[0].gid if same else None


class DmPort(Dependent):
    """The DM requester of one local port: a DEV_MGT MAD service on its QP1 alias."""

    _kind = "DM discovery port"

    def __init__(self, sink: AnswerSink, stats: Counter[str], ca: Ca, port: PortAttr) -> None:
        self._sink = sink
        self._stats = stats
        self.ca = ca
        self.attr = port
        self.port_guid = port.port_guid
        pd = ca.alloc_pd()
        self._pd = pd
        try:
            alias = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
            svc = MadSvc(MgmtClass.DEV_MGT, DM_CLASS_VERSION, self._on_recv, self._on_sent)
            self.service: MadService = reg_mad_svc(alias, svc)
            super().__init__((ca, port.port_num))
        except BaseException:
            with contextlib.suppress(IbError):
                pd.dealloc()
            raise

    def __repr__(self) -> str:
        return f"<DmPort {self.ca.name} port {self.attr.port_num} 0x{self.port_guid:016x}>"

    def send(self, token: object, addr: MadAddr, mad: bytes, timeout_ms: int) -> None:
        """Send a Get (its answer goes to the sink with ``token``); ``IbError`` if it cannot."""
        e = self.service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = addr
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, timeout_ms, 0
        e.context1 = token
        try:
            self.service.send(e)
        except IbError:
            put_mad(e)
            raise

    def _on_sent(self, e: MadElement) -> None:
        """Misc queue: a Get ended; with an answer, the answer gives the element back."""
        if e.status is WcStatus.SUCCESS and e.resp_expected:
            return
        put_mad(e)

    def _on_recv(self, e: MadElement) -> None:
        """Misc queue: the answer to one of our Gets (the sweep checks it)."""
        request = e.request
        mad = bytes(e.mad)
        put_mad([e] if request is None else [e, request])
        if request is None:
            self._stats["dropped_unsolicited"] += 1
            return
        self._sink(request.context1, mad)

    def cleanup(self) -> None:
        with contextlib.suppress(IbError):
            self._pd.dealloc()


class TargetSearch:
    """The SA phase of one sweep (see the module docstring); ``done()`` once it ended."""

    capability = CapabilityMask.IS_DEVICE_MANAGEMENT_SUPPORTED
    """The PortInfo capability bit a target's port has (a test on a fabric where no port
    advertises device management may ask for another one)."""

    def __init__(self, ports: Mapping[int, DmPort], peers: Sequence[RocePeer], *,
                 timeout_ms: int, retries: int, lock: Any, stats: Counter[str],
                 done: Callable[[], object]) -> None:  # fmt: skip
        self.ports = dict(ports)
        self.peers = tuple(peers)
        self.timeout_ms, self.retries = timeout_ms, retries
        self.targets: list[Target] = []
        self.blind: set[int] = set()
        self.over = False
        self._lock = lock
        self._stats = stats
        self._done = done
        self._pending = 0
        self._sa_ports: list[SaPort] = []

    def start(self) -> None:
        """Under the lock: every port's first question."""
        self._pending += 1  # held while the requests go out
        for dp in self.ports.values():
            try:
                port = SaPort.open(dp.ca.al, dp.port_guid)
            except IbError as exc:
                self._stats["sa_unavailable"] += 1
                self.blind.add(dp.port_guid)
                log.info("IOC discovery: no SA port on %r: %s", dp, exc)
                continue
            self._sa_ports.append(port)
            if dp.attr.link_layer is LinkLayer.INFINIBAND:
                pir = sa.PORT_INFO_RECORD.encode(capability_mask=int(self.capability))
                self._ask(port, SaAttr.PORT_INFO_RECORD, pir, _PIR_MASK,
                          functools.partial(self._on_pirs, dp, port),
                          attr_mod=ENHANCED_COMP_MASK)  # fmt: skip
            else:
                for peer in self.peers:
                    self._ask_path(dp, port, None, peer.gid.packed, peer)
        self._answered()

    def cancel(self) -> None:
        """Under the lock: stop; answers still coming are ignored, ``done`` is not called."""
        self.over = True
        self._close()

    # ------------------------------------------------------------------ questions
    def _ask(self, port: SaPort, attr: SaAttr, data: bytes, mask: int,
             then: Callable[[list[dict[str, Any]]], None], attr_mod: int = 0) -> None:  # fmt: skip
        """Under the lock: one SA GetTable; ``then(records)`` with the decoded records."""
        table = _RECORD[attr]

        def answered(answer: SaAnswer) -> None:
            with self._lock:
                if self.over:
                    return
                if answer.ok:
                    try:
                        then([table.decode(r[: table.size]) for r in answer.records])
                    except (FieldError, InvalidParameter) as exc:  # a record without sense
                        self._stats["sa_malformed"] += 1
                        self.blind.add(port.port_guid)
                        log.info("IOC discovery: SA %s record dropped: %s", attr.name, exc)
                elif attr == SaAttr.PATH_RECORD:  # no way to that port (now): it goes
                    self._stats["no_path"] += 1
                    log.info("IOC discovery: no path: %s %s", answer.status.name, answer.detail)
                else:
                    self._stats["sa_failed"] += 1
                    self.blind.add(port.port_guid)
                    log.info("IOC discovery: SA %s: %s %s", attr.name, answer.status.name,
                             answer.detail)  # fmt: skip
                self._answered()

        self._pending += 1
        try:
            port.request(Method.GET_TABLE, attr, data, mask, attr_mod=attr_mod,
                         timeout_ms=self.timeout_ms, retry_cnt=self.retries,
                         callback=answered)  # fmt: skip
        except IbError as exc:
            self._pending -= 1
            self._stats["sa_failed"] += 1
            self.blind.add(port.port_guid)
            log.info("IOC discovery: SA %s not asked: %s", attr.name, exc)

    def _on_pirs(self, dp: DmPort, port: SaPort, recs: list[dict[str, Any]]) -> None:
        for r in recs:
            data = sa.NODE_RECORD.encode(lid=int(r["endport_lid"]))
            self._ask(port, SaAttr.NODE_RECORD, data, _NR_MASK,
                      functools.partial(self._on_nodes, dp, port))

    def _on_nodes(self, dp: DmPort, port: SaPort, recs: list[dict[str, Any]]) -> None:
        for n in recs:
            desc = bytes(n["node_string"]).split(b"\0", 1)[0].decode("utf-8", "replace")
            while len(desc.encode()) > NODE_DESC_SIZE:
                desc = desc[:-1]
            iou = IouInfo(guid=int(n["node_guid"]), ca_guid=dp.ca.guid,
                          chassis_guid=int(n["system_image_guid"]), vend_id=int(n["vendor_id"]),
                          dev_id=int(n["device_id"]), revision=int(n["revision"]), desc=desc)
            prefix = dp.attr.gids[0].packed[:8] if dp.attr.gids else bytes(8)
            dgid = prefix + int(n["port_guid"]).to_bytes(8, "big")
            self._ask_path(dp, port, iou, dgid, None)

    def _ask_path(self, dp: DmPort, port: SaPort, iou: IouInfo | None, dgid: bytes,
                  peer: RocePeer | None) -> None:  # fmt: skip
        values: dict[str, Any] = {"dgid": dgid}
        mask = _DGID_MASK
        sgid = source_gid(dp.attr, Gid(dgid))
        if sgid is not None:
            values["sgid"] = sgid.packed
            mask = _PR_MASK
        self._ask(port, SaAttr.PATH_RECORD, sa.PATH_RECORD.encode(values), mask,
                  functools.partial(self._on_paths, dp, iou, peer))

    def _on_paths(self, dp: DmPort, iou: IouInfo | None, peer: RocePeer | None,
                  recs: list[dict[str, Any]]) -> None:  # fmt: skip
        if not recs:
            self._stats["no_path"] += 1
            return
        p = recs[0]
        raw = sa.PATH_RECORD.encode(p)
        dgid = Gid(raw[8:24])
        if iou is None:  # a RoCE peer
            assert peer is not None
            guid = peer.iou_guid or int.from_bytes(dgid.packed[8:], "big")
            iou = IouInfo(guid=guid, ca_guid=dp.ca.guid, desc=peer.desc)
        self.targets.append(Target(iou, dp.ca.guid, dp.port_guid, (dp, _addr(dp, p, raw)), raw))

    def _answered(self) -> None:
        """Under the lock: one question ended; after the last, ``done()``."""
        self._pending -= 1
        if self._pending or self.over:
            return
        self.over = True
        self._close()
        # Answers come in any order: the targets in the ports' order, so a unit's CA and
        # its paths' order do not change from one sweep to the next by chance.
        rank = {g: i for i, g in enumerate(self.ports)}
        self.targets.sort(key=lambda t: (rank.get(t.port_guid, len(rank)), t.path))
        self._done()

    def _close(self) -> None:
        ports, self._sa_ports = self._sa_ports, []
        for p in ports:
            with contextlib.suppress(IbError):
                p.close()


def _addr(dp: DmPort, p: dict[str, Any], raw: bytes) -> MadAddr:
    """Where a DM Get along PathRecord ``p`` goes (QP1; a GRH on RoCE)."""
    grh = None
    if dp.attr.link_layer is not LinkLayer.INFINIBAND:
        sgid = Gid(raw[24:40])
        index = next((e.index for e in dp.attr.gid_table if e.gid == sgid), 0)
        grh = Grh(dgid=Gid(raw[8:24]), sgid_index=index, hop_limit=int(p["hop_limit"]) or 64,
                  traffic_class=int(p["tclass"]))  # fmt: skip
    return MadAddr(dlid=int(p["dlid"]), sl=int(p["sl"]), grh=grh)
