"""``ibal ibqueryerrors``: the error counters of every port of the fabric over a threshold.

A sweep (:func:`ibal.tools.links.read_links`), then per node the PMA's
ClassPortInfo and PortCounters, as infiniband-diags' ``ibqueryerrors`` asks
them: one AllPortSelect read for a node whose PMA claims it (each port only
when that read shows an error), else each port.  Thresholds come from the
same file format (``name=value`` lines, default
``/etc/infiniband-diags/error_thresholds``); ``-k``/``-K`` clear the
counters after the read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click

from ibal.mad.discover import DiscNode
from ibal.mad.rpc import MadClient, MadError
from ibal.records import record
from ibal.tools.cliopts import node_name_map_option
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid
from ibal.tools.links import Fabric, link_text, load_fabric, port_lid, read_links, remote_text
from ibal.wire.mad.consts import PerfAttr

__all__ = ["ERROR_COUNTERS", "Report", "check_errors", "ibqueryerrors_cmd", "read_thresholds"]

# libibmad's names of PortCounters' error counters, in its order, and the table's fields
ERROR_COUNTERS: Final = (
    ("SymbolErrorCounter", "symbol_error_counter"),
    ("LinkErrorRecoveryCounter", "link_error_recovery_counter"),
    ("LinkDownedCounter", "link_downed_counter"),
    ("PortRcvErrors", "port_rcv_errors"),
    ("PortRcvRemotePhysicalErrors", "port_rcv_remote_physical_errors"),
    ("PortRcvSwitchRelayErrors", "port_rcv_switch_relay_errors"),
    ("PortXmitDiscards", "port_xmit_discards"),
    ("PortXmitConstraintErrors", "port_xmit_constraint_errors"),
    ("PortRcvConstraintErrors", "port_rcv_constraint_errors"),
    ("LocalLinkIntegrityErrors", "local_link_integrity_errors"),
    ("ExcessiveBufferOverrunErrors", "excessive_buffer_overrun_errors"),
    ("VL15Dropped", "vl15_dropped"),
    ("PortXmitWait", "port_xmit_wait"),
)
DEFAULT_THRESHOLDS: Final = Path("/etc/infiniband-diags/error_thresholds")
_ALL_PORTS: Final = 0xFF
_CAP_ALL_PORT_SELECT: Final = 1 << 8
_CAP_EXT_WIDTH: Final = 1 << 9
_CAP_EXT_WIDTH_NOIETF: Final = 1 << 10
_CAP_XMIT_WAIT: Final = 1 << 12
_TYPE_FLAG: Final = {1: "ca", 2: "switch", 3: "router"}


def read_thresholds(path: Path) -> tuple[dict[str, int], str | None]:
    """The thresholds a file sets, and the summary's "Thresholds:" text (``None``: no file)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}, None
    names = {n for n, _ in ERROR_COUNTERS}
    out: dict[str, int] = {}
    text = "Thresholds: "
    for line in lines:
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        if name in names:
            try:
                out[name] = int(value.strip() or "0", 0)
            except ValueError:
                out[name] = 0
            text += f"[{name} = {out[name]}]"
    return out, text


@record
class Report:
    """What one run found: the text's lines and the same as data."""

    lines: list[str]
    nodes: list[dict[str, Any]]
    nodes_checked: int = 0
    bad_nodes: int = 0
    ports_checked: int = 0
    bad_ports: int = 0
    pma_failures: int = 0


def _over(pc: dict[str, Any], cap: int, suppressed: set[str],
          thresholds: dict[str, int]) -> list[tuple[str, int]]:  # fmt: skip
    found = []
    for name, fld in ERROR_COUNTERS:
        if name in suppressed:
            continue
        value = int(pc[fld])
        if name == "PortXmitWait" and not cap & _CAP_XMIT_WAIT:
            value = 0  # not claimed by the PMA: cleared, as ibqueryerrors does
        if value > thresholds.get(name, 0):
            found.append((name, value))
    return found


def _node_lid(node: DiscNode) -> int:
    if node.is_switch:
        return node.lid
    first = next((p for n, p in sorted(node.ports.items()) if n), None)
    return first.lid if first else 0


# the data counters --data and --counters show, libibmad's names: PortCounters', and
# PortCountersExtended's (the four packet counts only when the PMA has the full set)
DATA_COUNTERS: Final = (("PortXmitData", "port_xmit_data"), ("PortRcvData", "port_rcv_data"),
                        ("PortXmitPkts", "port_xmit_pkts"), ("PortRcvPkts", "port_rcv_pkts"))
EXT_DATA_COUNTERS: Final = (
    *DATA_COUNTERS,
    ("PortUnicastXmitPkts", "port_unicast_xmit_pkts"),
    ("PortUnicastRcvPkts", "port_unicast_rcv_pkts"),
    ("PortMulticastXmitPkts", "port_multicast_xmit_pkts"),
    ("PortMulticastRcvPkts", "port_multicast_rcv_pkts"),
)  # fmt: skip
_BYTES: Final = frozenset({"PortXmitData", "PortRcvData"})
_UNITS: Final = ("", "K", "M", "G", "T", "P", "E")


def _f32(x: float) -> float:
    import struct

    out: float = struct.unpack("f", struct.pack("f", x))[0]
    return out


def human(value: int, data: bool) -> str:
    """``conv_cnt_human_readable`` and ``%5.3f%s``: a count in 1024s, a data count (4-byte
    words) in bytes; in C ``float``, so the digits are the C tool's."""
    tmp, ui, div = value // 1024, 0, 1
    while tmp:
        ui, tmp, div = ui + 1, tmp // 1024, div * 1024
    val = _f32(float(value))
    if data:
        val = _f32(val * 4)
        if _f32(val / _f32(float(div))) > 1024:
            ui, div = ui + 1, div * 1024
    val = _f32(val / _f32(float(div)))
    unit = (_UNITS[ui] + "B" if data else _UNITS[ui]) if ui < len(_UNITS) else ""
    return f"{val:5.3f}{unit}"


def _data_text(counters: dict[str, Any], names: Sequence[tuple[str, str]], *,
               all_values: bool) -> tuple[str, dict[str, int]]:  # fmt: skip
    text, out = "", {}
    for name, fld in names:
        v = int(counters[fld])
        if v or all_values:
            text += f" [{name} == {v} ({human(v, name in _BYTES)})]"
            out[name] = v
    return text, out


# ibqueryerrors --details asks PortXmitDiscardDetails for a port's PortXmitDiscards and
# PortRcvErrorDetails for its PortRcvErrors, but reads each answer with the other
# attribute's field list (its print_results: the field ranges are swapped); the same here
_DETAILS: Final = {
    "PortXmitDiscards": (PerfAttr.PORT_XMIT_DISCARD_DETAILS, "PortXmitDiscardDetails",
                         "PORT_XMIT_DISCARD_DETAILS", "PORT_RCV_ERROR_DETAILS",
                         ("PortLocalPhysicalErrors", "PortMalformedPktErrors",
                          "PortBufferOverrunErrors", "PortDLIDMappingErrors",
                          "PortVLMappingErrors", "PortLoopingErrors")),
    "PortRcvErrors": (PerfAttr.PORT_RCV_ERROR_DETAILS, "PortRcvErrorDetails",
                      "PORT_RCV_ERROR_DETAILS", "PORT_XMIT_DISCARD_DETAILS",
                      ("PortInactiveDiscards", "PortNeighborMTUDiscards",
                       "PortSwLifetimeLimitDiscards", "PortSwHOQLifetimeLimitDiscards")),
}  # fmt: skip


def check_errors(
    client: MadClient, fab: Fabric, nodes: Sequence[DiscNode], *, suppressed: set[str],
    thresholds: dict[str, int], types: set[str], report_port: bool = False,
    clear_errors: bool = False, clear_counts: bool = False, data: bool = False,
    details: bool = False, counters_only: bool = False,
) -> Report:  # fmt: skip
    """Read every node's counters and report the ports over a threshold.

    ``data`` (``--data``): a bad port's non-zero data counters after its errors;
    ``details`` (``--details``): the detail attribute of its PortXmitDiscards and
    PortRcvErrors; ``counters_only`` (``--counters``): every port's data counters
    instead of its errors.
    """
    from ibal.wire.mad import perf

    rep = Report([], [])

    def one(node: DiscNode) -> None:
        if types and _TYPE_FLAG.get(node.node_type) not in types:
            return
        lid = _node_lid(node)
        name = node.desc
        head = False
        bad_ports: list[dict[str, Any]] = []
        start = 0 if node.is_switch and node.enhanced_port0 else 1
        try:
            cpi = perf.CLASS_PORT_INFO.decode(client.perf_get(PerfAttr.CLASS_PORT_INFO, lid,
                                                              mod=0))  # fmt: skip
            cap = int(cpi["capability_mask"])
        except MadError:
            rep.pma_failures += 1
            cap = 0
        ext = bool(cap & (_CAP_EXT_WIDTH | _CAP_EXT_WIDTH_NOIETF))
        data_names = ((EXT_DATA_COUNTERS if cap & _CAP_EXT_WIDTH else DATA_COUNTERS)
                      if ext else DATA_COUNTERS)  # fmt: skip

        def read(port: int, table: Any = perf.PORT_COUNTERS,
                 attr: int = PerfAttr.PORT_COUNTERS) -> dict[str, Any] | None:  # fmt: skip
            sel = table.encode(port_select=port)
            try:
                return dict(table.decode(client.perf_get(attr, lid, sel)))
            except MadError:
                rep.pma_failures += 1
                return None

        def read_data(port: int) -> dict[str, Any] | None:
            if ext:
                return read(port, perf.PORT_COUNTERS_EXT, PerfAttr.PORT_COUNTERS_EXT)
            return read(port)

        def detail(port: int, counter: str) -> str:
            attr, _, asked, shape, names = _DETAILS[counter]
            sel = getattr(perf, asked).encode(port_select=port)
            try:
                raw = client.perf_get(attr, lid, sel)
            except MadError:
                rep.pma_failures += 1
                return ""
            got = list(getattr(perf, shape).decode(bytes(raw)).values())[2:]
            return "".join(f" [{n} == {v}]" for n, v in zip(names, got, strict=False) if v)

        def heading() -> None:
            nonlocal head
            if head:
                return
            head = True
            if counters_only:
                rep.lines.append(f"Data Counters for 0x{node.guid:x} \"{name}\"")
                return
            p0 = node.ports.get(0)
            rep.lines.append(f"Errors for 0x{p0.guid if p0 else node.port_guid:x} "
                             f"\"{name}\"" if node.is_switch else f"Errors for \"{name}\"")
            rep.bad_nodes += 1

        def show(port: int, found: list[tuple[str, int]]) -> None:
            text = ""
            for n, v in found:
                text += f" [{n} == {v}]"
                if details and n in _DETAILS:
                    text += detail(port, n)
            extra: dict[str, int] = {}
            if data:
                counters = read_data(port) if ext else pc_of[port]
                if counters is not None:
                    more, extra = _data_text(counters, data_names, all_values=False)
                    text += more
            heading()
            if port == _ALL_PORTS:
                p0 = node.ports.get(0)
                if node.is_switch:
                    rep.lines.append(f"   GUID 0x{p0.guid if p0 else node.port_guid:x} port "
                                     f"ALL:{text}")  # fmt: skip
                return
            pg = node.ports[port].guid
            rep.lines.append(f"   GUID 0x{pg:x} port {port}:{text}")
            if report_port and (node.guid, port) in fab.info:
                rep.lines.append(_link_info(fab, node, port))
            rep.bad_ports += 1
            entry: dict[str, Any] = {"PortNum": port, "PortGUID": guid(pg),
                                     "counters": dict(found)}
            if data:
                entry["data"] = extra
            bad_ports.append(entry)

        def show_data(port: int) -> None:
            counters = read_data(port)
            if counters is None:
                return
            text, values = _data_text(counters, data_names, all_values=True)
            heading()
            rep.lines.append(f"   GUID 0x{node.guid:x} port {port}:{text}")
            if report_port and (node.guid, port) in fab.info:
                rep.lines.append(_link_info(fab, node, port))
            bad_ports.append({"PortNum": port, "PortGUID": guid(node.ports[port].guid),
                              "counters": {}, "data": values})  # fmt: skip

        pc_of: dict[int, dict[str, Any] | None] = {}
        all_ports = bool(cap & _CAP_ALL_PORT_SELECT)
        per_port = True
        if counters_only:
            for port in range(start, node.num_ports + 1):
                if port in node.ports:
                    show_data(port)
                    rep.ports_checked += 1
                    if not all_ports:
                        _clear(client, lid, port, cap, clear_errors, clear_counts, details)
            per_port = False
        elif all_ports:
            pc = pc_of[_ALL_PORTS] = read(_ALL_PORTS)
            found = _over(pc, cap, suppressed, thresholds) if pc is not None else []
            if pc is not None and not found:
                rep.ports_checked += node.num_ports
                per_port = False
            elif found:
                show(_ALL_PORTS, found)
        if per_port:
            for port in range(start, node.num_ports + 1):
                if port not in node.ports:
                    continue
                pc = pc_of[port] = read(port)
                if pc is not None:
                    found = _over(pc, cap, suppressed, thresholds)
                    if found:
                        show(port, found)
                rep.ports_checked += 1
                if not all_ports:
                    _clear(client, lid, port, cap, clear_errors, clear_counts, details)
        rep.nodes_checked += 1
        if all_ports:
            _clear(client, lid, _ALL_PORTS, cap, clear_errors, clear_counts, details)
        if bad_ports:
            rep.nodes.append({"NodeType": {1: "CA", 2: "Switch", 3: "Router"}.get(
                node.node_type, "??"), "NodeGUID": guid(node.guid), "NodeDescription": name,
                "LID": lid, "ports": bad_ports})  # fmt: skip

    for node in nodes:
        one(node)
    return rep


def _link_info(fab: Fabric, node: DiscNode, port: int) -> str:
    """``-r``'s line: the port's link as iblinkinfo shows it, the far end's GUID first."""
    link = link_text(fab, node, port, fab.info[(node.guid, port)], False)
    remote = remote_text(fab, node, port, with_guid=True)
    return f"       Link info: {port_lid(node, port):6d}{port:4d}[  ] =={link}==>  {remote}"


def _clear(client: MadClient, lid: int, port: int, cap: int, errors: bool, counts: bool,
           details: bool = False) -> None:  # fmt: skip
    from ibal.wire.mad import perf

    mask = 0
    if errors:
        mask |= 0xFFF | (0x10000 if cap & _CAP_XMIT_WAIT else 0)
    if counts:
        mask |= 0xF000
    if mask:
        data = perf.PORT_COUNTERS.encode(port_select=port, counter_select=mask & 0xFFFF,
                                         counter_select2=mask >> 16)  # fmt: skip
        client.perf_set(PerfAttr.PORT_COUNTERS, lid, data)
    if errors and details:  # every detail counter, as ibqueryerrors -k --details
        for table, attr, mask in ((perf.PORT_XMIT_DISCARD_DETAILS,
                                   PerfAttr.PORT_XMIT_DISCARD_DETAILS, 0xF),
                                  (perf.PORT_RCV_ERROR_DETAILS,
                                   PerfAttr.PORT_RCV_ERROR_DETAILS, 0x3F)):  # fmt: skip
            # as the C tool: a PMA without the optional attribute is no error
            with contextlib.suppress(MadError):
                client.perf_set(attr, lid, table.encode(port_select=port, counter_select=mask))
    if counts and cap & (_CAP_EXT_WIDTH | _CAP_EXT_WIDTH_NOIETF):
        ext = 0xFF if cap & _CAP_EXT_WIDTH else 0x0F
        data = perf.PORT_COUNTERS_EXT.encode(port_select=port, counter_select=ext)
        client.perf_set(PerfAttr.PORT_COUNTERS_EXT, lid, data)


def summary(rep: Report, thresholds_text: str | None, suppressed: Sequence[str]) -> list[str]:
    out = ["", f"## Summary: {rep.nodes_checked} nodes checked, {rep.bad_nodes} bad nodes found",
           f"##          {rep.ports_checked} ports checked, {rep.bad_ports} ports have errors "
           "beyond threshold", f"## {thresholds_text if thresholds_text is not None else '(null)'}"]
    if rep.pma_failures:
        out.append(f"##          {rep.pma_failures} PMA query failures")
    out.append("## Suppressed:" + "".join(f" {s}" for s in suppressed))
    return out


@click.command("ibqueryerrors")
@click.option("-s", "--suppress", metavar="ERR1,ERR2,...", help="Suppress the errors listed.")
@click.option("-c", "--suppress-common", is_flag=True, help="Suppress PortRcvSwitchRelayErrors.")
@click.option("-G", "--port-guid", "port_guid", metavar="GUID",
              help="Only the node with this port GUID.")  # fmt: skip
@click.option("-S", "port_guid_s", metavar="GUID", help="Same as -G.")
@click.option("-D", "--Direct", "dr_path", metavar="DR_PATH", help="Only the node at DR_PATH.")
@click.option("--skip-sl", is_flag=True, help="Accepted (the PMA is asked on SL 0 anyway).")
@click.option("-r", "--report-port", is_flag=True, help="Add each bad port's link.")
@click.option("--threshold-file", type=click.Path(path_type=Path), default=DEFAULT_THRESHOLDS,
              show_default=True, help="Thresholds (name=value lines).")  # fmt: skip
@click.option("--switch", "only_switch", is_flag=True, help="Switches only.")
@click.option("--ca", "only_ca", is_flag=True, help="CAs only.")
@click.option("--router", "only_router", is_flag=True, help="Routers only.")
@click.option("-k", "--clear-errors", is_flag=True, help="Clear the error counters after reading.")
@click.option("-K", "--clear-counts", is_flag=True, help="Clear the data counters after reading.")
@click.option("--data", "data", is_flag=True, help="A bad port's data counters too.")
@click.option("--details", is_flag=True,
              help="The details of PortXmitDiscards and PortRcvErrors too.")
@click.option("--counters", "counters_only", is_flag=True, help="Only the data counters.")
@click.option("-R", "nop", is_flag=True, hidden=True)
@click.option("--load-cache", "load_cache", type=click.Path(path_type=Path),
              help="The fabric of this ibnetdiscover cache file (no sweep).")  # fmt: skip
@node_name_map_option
@fabric_options(via="agent")
def ibqueryerrors_cmd(suppress: str | None, suppress_common: bool, port_guid: str | None,
                      port_guid_s: str | None, dr_path: str | None, skip_sl: bool,
                      report_port: bool, threshold_file: Path, only_switch: bool,
                      only_ca: bool, only_router: bool, clear_errors: bool, clear_counts: bool,
                      data: bool, details: bool, counters_only: bool, nop: bool,
                      load_cache: Path | None, node_name_map: Path | None, as_json: bool,
                      **kw: Any) -> None:  # fmt: skip
    """ibqueryerrors: the ports of the fabric whose error counters are over a threshold."""
    from ibal.mad.rpc import PortId, parse_dr_path
    from ibal.tools import nodemap
    from ibal.wire.mad import smp
    from ibal.wire.mad.consts import SmpAttr

    names = {n for n, _ in ERROR_COUNTERS} | {"QP1Dropped"}
    suppressed = [s for s in (suppress or "").split(",") if s in names]
    if suppress_common:
        suppressed.append("PortRcvSwitchRelayErrors")
    thresholds, thr_text = read_thresholds(threshold_file)
    types = {t for t, on in (("switch", only_switch), ("ca", only_ca),
                             ("router", only_router)) if on}  # fmt: skip
    label = port_guid or port_guid_s
    if dr_path is not None and load_cache is not None:
        raise click.ClickException("Cannot specify cache and direct route path")
    # a cache stands for the sweep only: the counters are still read from the PMAs
    cached = load_fabric(load_cache) if load_cache is not None else None
    with fabric_client("ibqueryerrors", kw) as client:
        fab = cached if cached is not None else read_links(client)
        nodemap.apply(fab.topology, nodemap.load(node_name_map))
        nodes = fab.nodes()
        target = int(label, 0) if label else None
        if dr_path is not None:
            ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO,
                                                     PortId(dr_path=parse_dr_path(dr_path))))
            target = int(ni["port_guid"])
        if target is not None:
            nodes = [n for n in nodes if any(p.guid == target for p in n.ports.values())][:1]
        rep = check_errors(client, fab, nodes, suppressed=set(suppressed),
                           thresholds=thresholds, types=types, report_port=report_port,
                           clear_errors=clear_errors, clear_counts=clear_counts, data=data,
                           details=details, counters_only=counters_only)  # fmt: skip
    if target is not None and not nodes:
        click.echo(f"Failed to find node: {label or dr_path}", err=True)
    if as_json:
        emit_json({"NodesChecked": rep.nodes_checked, "BadNodes": rep.bad_nodes,
                   "PortsChecked": rep.ports_checked, "BadPorts": rep.bad_ports,
                   "PMAQueryFailures": rep.pma_failures, "Thresholds": thresholds,
                   "Suppressed": suppressed, "nodes": rep.nodes})  # fmt: skip
    else:
        text = rep.lines + summary(rep, thr_text, suppressed)
        click.echo("".join(line + "\n" for line in text), nl=False)
    if rep.bad_ports:
        raise SystemExit(1)
