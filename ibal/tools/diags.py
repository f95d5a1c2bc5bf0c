"""``ibal smpquery``, ``perfquery``, ``sminfo``, ``ibroute``, ``discover``: infiniband-diags.

Each command is a function of a :class:`~ibal.mad.rpc.MadClient` returning
the text the real tool prints for the same target (field names and value
formats from :mod:`ibal.wire.mad.dump`, the topology from
:mod:`ibal.mad.discover`); :mod:`ibal.cli` only opens the port and prints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Final

from ibal.mad.rpc import MadClient, MadError, PortId, smp_request
from ibal.wire.mad import smp
from ibal.wire.mad.consts import PerfAttr, SmpAttr

if TYPE_CHECKING:  # the sweep is imported by discover() alone: smpquery & co. need none of it
    from ibal.mad.discover import Sweep

__all__ = ["SMPQUERY_OPS", "discover", "ibroute", "perfquery", "sminfo", "smpquery"]

SMPQUERY_OPS: Final = ("nodeinfo", "portinfo", "nodedesc", "switchinfo", "pkeys", "guids")
_ALIASES: Final = {"ni": "nodeinfo", "pi": "portinfo", "nd": "nodedesc", "si": "switchinfo",
                   "pkeytable": "pkeys", "guidinfo": "guids", "gi": "guids"}  # fmt: skip


def op_name(op: str) -> str:
    """The canonical operation for ``op`` (smpquery's names and aliases, any case)."""
    name = op.lower()
    name = _ALIASES.get(name, name)
    if name not in SMPQUERY_OPS:
        raise MadError(f"operation '{op}' not supported")
    return name


def _named(nd: bytes, ni: bytes, names: dict[int, str] | None) -> bytes:
    """A NodeDescription as ``--node-name-map`` has it: the map's name for the node of
    NodeInfo ``ni``, else ``nd`` as it came."""
    if not names:
        return nd
    from ibal.tools.nodemap import remap

    desc = nd.split(b"\0", 1)[0].decode("latin-1")
    name = remap(names, int(smp.NODE_INFO.decode(ni)["node_guid"]), desc)
    return name.encode("latin-1", errors="replace").ljust(len(nd), b"\0")


def smpquery(client: MadClient, op: str, to: PortId, port: int = 0,
             names: dict[int, str] | None = None) -> str:  # fmt: skip
    """What ``smpquery OP TARGET [PORT]`` prints (``names``: a ``--node-name-map``)."""
    from ibal.wire.mad import dump

    name = op_name(op)
    get = client.smp_get
    if name == "nodeinfo":
        return dump.smpquery_nodeinfo(get(SmpAttr.NODE_INFO, to), str(to))
    if name == "portinfo":
        return dump.smpquery_portinfo(get(SmpAttr.PORT_INFO, to, port), str(to), port)
    if name == "switchinfo":
        return dump.smpquery_switchinfo(get(SmpAttr.SWITCH_INFO, to), str(to))
    if name == "nodedesc":
        raw = bytes(get(SmpAttr.NODE_INFO, to))  # as smpquery: NodeInfo first (the GUID)
        return dump.smpquery_nodedesc(_named(bytes(get(SmpAttr.NODE_DESC, to)), raw, names))
    if name == "pkeys":
        ni = smp.NODE_INFO.decode(get(SmpAttr.NODE_INFO, to))
        if port > int(ni["num_ports"]):
            raise MadError("invalid port number")
        if ni["node_type"] == smp.NodeType.SWITCH and port:
            cap = int(smp.SWITCH_INFO.decode(get(SmpAttr.SWITCH_INFO, to))[
                "partition_enforcement_cap"])  # fmt: skip
        else:
            cap = int(ni["partition_cap"])
        blocks = _blocks(client, SmpAttr.PKEY_TABLE, to, (cap + 31) // 32, port << 16)
        return dump.smpquery_pkeys(blocks, cap)
    pi = smp.PORT_INFO.decode(get(SmpAttr.PORT_INFO, to, 0))
    gcap = int(pi["guid_cap"])
    return dump.smpquery_guids(_blocks(client, SmpAttr.GUID_INFO, to, (gcap + 7) // 8, 0), gcap)


def sminfo(client: MadClient, to: PortId | None = None) -> str:
    """What ``sminfo [TARGET]`` prints: the SMInfo of TARGET, by default of the SM the
    local port names (its PortInfo's MasterSMLID)."""
    from ibal.wire.mad import dump

    if to is None:
        pi = smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, PortId(dr_path=())))
        to = PortId(int(pi["master_sm_lid"]))
    return dump.sminfo(client.smp_get(SmpAttr.SM_INFO, to), to.lid)


def _check_switch(client: MadClient, to: PortId) -> tuple[bytes, bytes, bytes]:
    """ibroute's checks, in its order and with its words: NodeInfo, NodeDescription, a
    switch, SwitchInfo."""

    def get(attr: int, why: str) -> bytes:
        try:
            return client.smp_get(attr, to)
        except MadError as exc:
            raise MadError(f"dump tables: {why} ({exc})") from exc

    ni = get(SmpAttr.NODE_INFO, "node info failed: valid addr?")
    nd = get(SmpAttr.NODE_DESC, "node desc failed")
    if smp.NODE_INFO.decode(ni)["node_type"] != smp.NodeType.SWITCH:
        raise MadError("dump tables: not a switch")
    return ni, nd, get(SmpAttr.SWITCH_INFO, "switch info failed: is a switch node?")


_DEST_ATTRS: Final = (SmpAttr.NODE_INFO, SmpAttr.PORT_INFO, SmpAttr.NODE_DESC)


def ibroute(
    client: MadClient, to: PortId, start: int = 0, end: int = 0, *, all_lids: bool = False,
    no_dests: bool = False, window: int = 32, multicast: bool = False,
    names: dict[int, str] | None = None,
) -> str:  # fmt: skip
    """What ``ibroute [-a] [-n] [-M] SWITCH [START [END]]`` prints: the switch's unicast
    LinearForwardingTable, each destination named by its NodeInfo/PortInfo/NodeDescription,
    or (``multicast``, ``-M``) its MulticastForwardingTable (``-n``: the masks in hex).

    ibroute asks each destination LID in turn; here every valid LID is asked at once
    (``window`` SMPs in flight), which reads the same answers sooner.  ``names``: a
    ``--node-name-map``, for the switch and each destination.
    """
    from ibal.wire.mad import dump

    ni, nd, si = _check_switch(client, to)
    nd = _named(bytes(nd), bytes(ni), names)
    if multicast:
        span = dump.ibroute_mcast_span(si, start, end, all_mlids=all_lids)
        mods = dump.ibroute_mcast_mods(span, int(smp.NODE_INFO.decode(ni)["num_ports"]))
        replies = client.call_many([smp_request(SmpAttr.MCAST_FT, to, m) for m in mods],
                                   window=8)  # fmt: skip
        bad = next((r for r in replies if not r.ok), None)
        if bad is not None:  # ibroute's words, then it stops
            raise MadError(f"SubnGet() failed; MAD status 0x{bad.status:x} "
                           f"AM 0x{bad.request.attr_mod:x}")  # fmt: skip
        blocks = {m: bytes(r.data) for m, r in zip(mods, replies, strict=True)}
        return dump.ibroute_mcast(ni, nd, str(to), span, blocks, brief=no_dests,
                                  all_mlids=all_lids)  # fmt: skip
    span = dump.ibroute_span(si, start, end)
    nums = dump.ibroute_blocks(span)
    blocks = dict(zip(nums, _blocks(client, SmpAttr.LINEAR_FT, to, len(nums), nums.start),
                      strict=True))  # fmt: skip
    dests: dict[int, dump.LidInfo | None] | None = None
    if not no_dests:
        nports = int(smp.NODE_INFO.decode(ni)["num_ports"])
        lids = [lid for lid, port in dump.ibroute_entries(blocks, span) if port <= nports]
        # LID 0 is the local port to libibmad (a LID-routed SMP to LID 0 goes directed)
        reqs = [smp_request(a, PortId(lid) if lid else PortId(dr_path=()))
                for lid in lids for a in _DEST_ATTRS]  # fmt: skip
        replies = client.call_many(reqs, window=window)
        dests = {}
        for i, lid in enumerate(lids):
            got = replies[3 * i : 3 * i + 3]
            dests[lid] = None
            if all(r.ok for r in got):
                dests[lid] = (bytes(got[0].data), bytes(got[1].data),
                              _named(bytes(got[2].data), bytes(got[0].data), names))
    return dump.ibroute(ni, nd, str(to), span, blocks, dests, all_lids=all_lids)


def _blocks(client: MadClient, attr: int, to: PortId, n: int, mod: int) -> list[bytes]:
    replies = client.call_many([smp_request(attr, to, i + mod) for i in range(n)], window=8)
    return [bytes(r.data) for r in replies]


# CounterSelect bits: which counters a reset (a Set) clears: all of them.
_RESET_ALL = {"counter_select": 0xFFFF, "counter_select2": 0xFF}
_RESET_EXT = {"counter_select": 0xFFFF}


def perfquery(
    client: MadClient, lid: int, port: int, *, extended: bool = False, reset: bool = False
) -> str:
    """What ``perfquery [-x] [-r] LID PORT`` prints (``-r``: reset after reading)."""
    from ibal.wire.mad import dump, perf

    cpi = perf.CLASS_PORT_INFO.decode(client.perf_get(PerfAttr.CLASS_PORT_INFO, lid))
    cap, cap2 = int(cpi["capability_mask"]), int(cpi["capability_mask2"])
    to = str(PortId(lid))
    if extended:
        sel = perf.PORT_COUNTERS_EXT.encode(port_select=port)
        text = dump.perfquery_ext(client.perf_get(PerfAttr.PORT_COUNTERS_EXT, lid, sel), to,
                                  port, cap, cap2)  # fmt: skip
    else:
        sel = perf.PORT_COUNTERS.encode(port_select=port)
        text = dump.perfquery(client.perf_get(PerfAttr.PORT_COUNTERS, lid, sel), to, port, cap)
    if reset:
        # as perfquery: -x resets the extended counters only
        if extended:
            data = perf.PORT_COUNTERS_EXT.encode(port_select=port, **_RESET_EXT)
            client.perf_set(PerfAttr.PORT_COUNTERS_EXT, lid, data)
        else:
            data = perf.PORT_COUNTERS.encode(port_select=port, **_RESET_ALL)
            client.perf_set(PerfAttr.PORT_COUNTERS, lid, data)
    return text


class Progress:
    """``discovered N nodes, M SMPs in flight`` on a terminal, at most every 0.1 s."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._next = 0.0
        self.shown = False

    def __call__(self, engine: Sweep, in_flight: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 0.1
        n = len(engine.topology.nodes)
        self.stream.write(f"\rdiscovered {n} nodes, {in_flight} SMPs in flight ")
        self.stream.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def discover(
    client: MadClient, *, window: int = 64, progress: bool | None = None, show: bool = False,
    group: bool = False, list_types: Sequence[int] = (), ports: bool = False,
    names: dict[int, str] | None = None,
) -> str:  # fmt: skip
    """What ``ibnetdiscover`` prints for the fabric ``client``'s port is on (``names``: a
    ``--node-name-map``).

    ``progress``: a line on stderr while sweeping (default: when stderr is a terminal).
    As ibnetdiscover's options: ``show`` (``-s``) the nodes as found first, then
    ``ports`` (``-p``) the ports report, else ``list_types`` (``-l``/``-H``/``-S``/``-R``:
    ``smp.NodeType`` values) the node list, else the topology (``group``: ``-g``).
    """
    from ibal.mad.discover import (
        ibnetdiscover_list,
        ibnetdiscover_ports,
        ibnetdiscover_show,
        ibnetdiscover_text,
        sweep,
    )

    if progress is None:
        progress = sys.stderr.isatty()
    meter = Progress(sys.stderr) if progress else None
    try:
        engine = sweep(client, window=window, progress=meter)
    finally:
        if meter is not None:
            meter.end()
    if engine.topology.root is None:
        raise MadError("discover failed: the local port did not answer NodeInfo")
    topo = engine.topology
    head = ibnetdiscover_show(topo) if show else ""
    if ports:
        return head + ibnetdiscover_ports(topo, names)
    if list_types:
        return head + ibnetdiscover_list(topo, list_types, names)
    return head + ibnetdiscover_text(topo, time.ctime(), group=group, names=names)
