"""``--json`` of the commands that print text of their own: the diagnostics that came
before the administrator's tools (smpquery, perfquery, sminfo, ibroute, discover),
``devices``, ``info`` and ``perftest``; and ``discover --format dot``.

Keys are the IBA's field names (:func:`iba_name`: ``port_guid`` -> ``PortGUID``);
64-bit GUIDs and keys are ``0x`` strings of 16 digits, byte strings hex.  Each
command's shape is ``ibal/tools/schemas/<command>.schema.json``.
"""

from __future__ import annotations

from typing import Any, Final

from ibal.mad.discover import Topology
from ibal.tools.diagcli import emit_json, guid

__all__ = ["devices_json", "discover_dot", "discover_json", "discover_other", "emit_json",
           "fields_json", "iba_name", "info_json", "perfquery_json", "perftest_json",
           "sa_recorder", "sminfo_json", "smpquery_json"]  # fmt: skip

_WORDS: Final = {"guid": "GUID", "lid": "LID", "lmc": "LMC", "sm": "SM", "mtu": "MTU",
                 "vl": "VL", "vls": "VLs", "id": "ID", "gid": "GID", "qp": "QP", "qp1": "QP1",
                 "vl15": "VL15", "pkey": "PKey", "hoq": "HOQ", "fdb": "FDB", "sl": "SL",
                 "lft": "LFT", "ext": "Ext", "ipd": "IPD", "qkey": "QKey", "mkey": "MKey",
                 "dgid": "DGID", "sgid": "SGID", "dlid": "DLID", "slid": "SLID", "mlid": "MLID",
                 "mgid": "MGID", "tclass": "TClass", "qos": "QoS"}
_ALIASES: Final = {"m_key": "M_Key", "p_key_violations": "P_KeyViolations",
                   "q_key_violations": "Q_KeyViolations", "m_key_violations": "M_KeyViolations",
                   "m_key_lease_period": "M_KeyLeasePeriod",
                   "m_key_protect_bits": "M_KeyProtectBits", "sm_key": "SM_Key",
                   "act_count": "ActCount", "port_phys_state": "PortPhysicalState",
                   "pkey": "P_Key", "qkey": "Q_Key"}  # fmt: skip
_TYPES: Final = {1: "CA", 2: "Switch", 3: "Router"}


def iba_name(field: str) -> str:
    """The IBA's CamelCase name of a field table's snake_case field."""
    return _ALIASES.get(field) or "".join(_WORDS.get(w, w.capitalize()) for w in field.split("_"))


def fields_json(table: Any, data: Any) -> dict[str, Any]:
    """An attribute's fields by their IBA names (GUIDs and keys as hex strings)."""
    out: dict[str, Any] = {}
    for name, value in table.decode(data).items():
        if name.startswith(("resv", "reserved")):
            continue
        if isinstance(value, bytes | bytearray):
            out[iba_name(name)] = bytes(value).hex()
        elif name.endswith(("guid", "key", "prefix")) and table.by_name[name].field.bits == 64:
            out[iba_name(name)] = f"0x{int(value):016x}"
        else:
            out[iba_name(name)] = int(value)
    return out


def smpquery_json(client: Any, op: str, to: Any, port: int = 0) -> dict[str, Any]:
    """What ``smpquery --json OP TARGET [PORT]`` prints: the attribute's fields."""
    from ibal.mad.rpc import MadError, smp_request
    from ibal.tools.diags import op_name
    from ibal.wire.mad import smp
    from ibal.wire.mad.consts import SmpAttr

    name = op_name(op)
    get = client.smp_get
    head = {"Target": str(to), "PortNum": port}
    if name in ("nodeinfo", "portinfo", "switchinfo"):
        attr, table, mod = {"nodeinfo": (SmpAttr.NODE_INFO, smp.NODE_INFO, 0),
                            "portinfo": (SmpAttr.PORT_INFO, smp.PORT_INFO, port),
                            "switchinfo": (SmpAttr.SWITCH_INFO, smp.SWITCH_INFO, 0)}[name]
        return {"Attribute": table.name, **head, "fields": fields_json(table, get(attr, to, mod))}
    ni = smp.NODE_INFO.decode(get(SmpAttr.NODE_INFO, to))
    if name == "nodedesc":
        raw = bytes(get(SmpAttr.NODE_DESC, to)).split(b"\0", 1)[0]
        return {"Attribute": "NodeDescription", **head,
                "fields": {"NodeString": raw.decode("utf-8", "replace")}}
    if name == "pkeys":
        if port > int(ni["num_ports"]):
            raise MadError("invalid port number")
        cap = int(ni["partition_cap"])
        if ni["node_type"] == smp.NodeType.SWITCH and port:
            cap = int(smp.SWITCH_INFO.decode(get(SmpAttr.SWITCH_INFO, to))[
                "partition_enforcement_cap"])  # fmt: skip
        reps = client.call_many([smp_request(SmpAttr.PKEY_TABLE, to, i | port << 16)
                                 for i in range((cap + 31) // 32)], window=8)  # fmt: skip
        keys = [int.from_bytes(bytes(r.data)[i:i + 2], "big") for r in reps
                for i in range(0, 64, 2)][:cap]  # fmt: skip
        return {"Attribute": "P_KeyTable", **head,
                "fields": {"PartitionCap": cap, "P_Keys": keys}}
    pi = smp.PORT_INFO.decode(get(SmpAttr.PORT_INFO, to, 0))
    gcap = int(pi["guid_cap"])
    reps = client.call_many([smp_request(SmpAttr.GUID_INFO, to, i)
                             for i in range((gcap + 7) // 8)], window=8)  # fmt: skip
    guids = [guid(int.from_bytes(bytes(r.data)[i:i + 8], "big")) for r in reps
             for i in range(0, 64, 8)][:gcap]  # fmt: skip
    return {"Attribute": "GUIDInfo", **head, "fields": {"GUIDCap": gcap, "GUIDs": guids}}


def perfquery_json(client: Any, lid: int, port: int, *, extended: bool = False,
                   reset: bool = False) -> dict[str, Any]:  # fmt: skip
    """What ``perfquery --json`` prints: PortCounters(Extended) of LID's PORT."""
    from ibal.wire.mad import perf
    from ibal.wire.mad.consts import PerfAttr

    table, attr = ((perf.PORT_COUNTERS_EXT, PerfAttr.PORT_COUNTERS_EXT) if extended
                   else (perf.PORT_COUNTERS, PerfAttr.PORT_COUNTERS))  # fmt: skip
    cpi = perf.CLASS_PORT_INFO.decode(client.perf_get(PerfAttr.CLASS_PORT_INFO, lid))
    data = client.perf_get(attr, lid, table.encode(port_select=port))
    out = {"Attribute": table.name, "LID": lid, "PortNum": port,
           "CapabilityMask": int(cpi["capability_mask"]), "fields": fields_json(table, data)}
    if reset:
        sel = {"counter_select": 0xFFFF} if extended else {"counter_select": 0xFFFF,
                                                           "counter_select2": 0xFF}
        client.perf_set(attr, lid, table.encode(port_select=port, **sel))
    return out


def sminfo_json(client: Any, to: Any | None) -> dict[str, Any]:
    from ibal.mad.rpc import PortId
    from ibal.wire.mad import smp
    from ibal.wire.mad.consts import SmpAttr

    if to is None:
        pi = smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, PortId(dr_path=())))
        to = PortId(int(pi["master_sm_lid"]))
    data = client.smp_get(SmpAttr.SM_INFO, to)
    states = {0: "NOTACTIVE", 1: "DISCOVERING", 2: "STANDBY", 3: "MASTER"}
    fields = fields_json(smp.SM_INFO, data)
    return {"Attribute": "SMInfo", "LID": to.lid,
            "SMStateName": states.get(fields["SMState"], "UNKNOWN"), "fields": fields}


def discover_json(topo: Topology) -> dict[str, Any]:
    """A topology: nodes with their ports, and each link once (schema discover)."""
    nodes = []
    for n in topo.nodes.values():
        ports = [{"PortNum": p.num, "PortGUID": guid(p.guid), "LID": p.lid, "LMC": p.lmc,
                  "LinkWidthActive": p.width, "LinkSpeedActive": p.speed,
                  "LinkSpeedExtActive": p.ext_speed, "PortState": p.state,
                  "PortPhysicalState": p.phys_state,
                  "remote": None if p.remote is None else {
                      "NodeGUID": guid(p.remote[0]), "PortNum": p.remote[1]}}
                 for p in sorted(n.ports.values(), key=lambda q: q.num)]  # fmt: skip
        nodes.append({"NodeType": _TYPES.get(n.node_type, "??"), "NodeGUID": guid(n.guid),
                      "SystemImageGUID": guid(n.system_guid), "PortGUID": guid(n.port_guid),
                      "NumPorts": n.num_ports, "VendorID": n.vendor_id,
                      "DeviceID": n.device_id, "Revision": n.revision,
                      "NodeDescription": n.desc, "LID": n.lid,
                      "DRPath": [0, *n.path], "ports": ports})  # fmt: skip
    links = sorted(sorted(((guid(a), pa), (guid(b), pb))) for (a, pa), (b, pb) in
                   (tuple(link) for link in topo.links() if len(link) == 2))  # fmt: skip
    root = topo.nodes.get(topo.root) if topo.root is not None else None
    return {"Root": guid(root.guid) if root else None, "nodes": nodes,
            "links": [{"from": {"NodeGUID": a[0], "PortNum": a[1]},
                       "to": {"NodeGUID": b[0], "PortNum": b[1]}} for a, b in links]}


def discover_other(client: Any, fmt: str, window: int = 64) -> str:
    """``discover --format json|dot`` (and ``--json``): a sweep, then the topology."""
    import json

    from ibal.mad.discover import sweep
    from ibal.mad.rpc import MadError

    topo = sweep(client, window=window).topology
    if topo.root is None:
        raise MadError("discover failed: the local port did not answer NodeInfo")
    if fmt == "dot":
        return discover_dot(topo)
    return json.dumps(discover_json(topo), indent=2) + "\n"


_DOT_WIDTH: Final = {1: "1x", 2: "4x", 4: "8x", 8: "12x", 16: "2x"}
_DOT_SPEED: Final = {1: "SDR", 2: "DDR", 4: "QDR"}
_DOT_EXT: Final = {1: "FDR", 2: "EDR", 4: "HDR", 8: "NDR"}


def discover_dot(topo: Topology) -> str:
    """The topology as a Graphviz graph: switches (boxes) and CAs (ellipses) by their
    descriptions, each link once, labelled with its ports, width and speed."""

    def q(*lines: str) -> str:  # a DOT string; its lines joined by DOT's \n escape
        return '"' + "\\n".join(t.replace("\\", "\\\\").replace('"', '\\"')
                                for t in lines) + '"'

    out = ["graph fabric {", "\tnode [fontsize=10];", "\tedge [fontsize=8];"]
    for n in topo.nodes.values():
        shape = "box" if n.is_switch else "ellipse"
        label = q(n.desc, f"0x{n.guid:016x}", *([f"lid {n.lid}"] if n.lid else []))
        out.append(f"\t{q(f'{n.guid:016x}')} [shape={shape}, label={label}];")
    for link in sorted(topo.links(), key=sorted):
        if len(link) != 2:
            continue
        (a, pa), (b, pb) = sorted(link)
        port = topo.nodes[a].ports[pa]
        speed = _DOT_EXT.get(port.ext_speed) or _DOT_SPEED.get(port.speed, "?")
        rate = f"{_DOT_WIDTH.get(port.width, '?')} {speed}"
        out.append(f"\t{q(f'{a:016x}')} -- {q(f'{b:016x}')} [label={q(rate)}, "
                   f"taillabel={q(str(pa))}, headlabel={q(str(pb))}];")  # fmt: skip
    out.append("}")
    return "".join(line + "\n" for line in out)


def sa_recorder(ask: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``ask`` (saquery's SA request callable) wrapped to keep what each query returned,
    as ``saquery --json`` prints it: the attribute and its records' fields."""
    from ibal.wire.mad import header, sa
    from ibal.wire.mad.consts import SaAttr

    tables: dict[int, Any] = {
              SaAttr.NODE_RECORD: sa.NODE_RECORD, SaAttr.PORT_INFO_RECORD: sa.PORT_INFO_RECORD,
              SaAttr.PATH_RECORD: sa.PATH_RECORD, SaAttr.SERVICE_RECORD: sa.SERVICE_RECORD,
              SaAttr.MCMEMBER_RECORD: sa.MCMEMBER_RECORD, SaAttr.LINK_RECORD: sa.LINK_RECORD,
              SaAttr.GUID_INFO_RECORD: sa.GUID_INFO_RECORD,
              SaAttr.INFORM_INFO_RECORD: sa.INFORM_INFO_RECORD,
              SaAttr.CLASS_PORT_INFO: header.CLASS_PORT_INFO}  # fmt: skip
    got: list[dict[str, Any]] = []

    def recorded(method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0,
                 attr_mod: int = 0) -> Any:  # fmt: skip
        recs = ask(method, attr_id, data, comp_mask, attr_mod)
        table = tables.get(attr_id)
        got.append({"Attribute": table.name if table else f"0x{attr_id:04x}",
                    "ComponentMask": f"0x{comp_mask:016x}",
                    "records": [fields_json(table, r) if table else bytes(r).hex()
                                for r in recs]})  # fmt: skip
        return recs

    return recorded, got


def devices_json(rows: list[tuple[str, str, int, int]]) -> dict[str, Any]:
    return {"cas": [{"CAName": name, "Provider": prov, "NodeGUID": guid(g), "NumPorts": n}
                    for name, prov, g, n in rows]}  # fmt: skip


def info_json(name: str, provider: str, attr: Any, missing: dict[str, str]) -> dict[str, Any]:
    """One CA's attributes and ports (``ib_ca_attr_t``/``ib_port_attr_t``'s fields)."""
    return {
        "CAName": name, "Provider": provider, "NodeGUID": guid(attr.ca_guid),
        "SystemImageGUID": guid(attr.system_image_guid), "VendorID": attr.vendor_id,
        "DeviceID": attr.device_id, "Revision": attr.revision,
        "FirmwareVersion": attr.fw_version, "MaxQPs": attr.max_qps, "MaxWRs": attr.max_wrs,
        "MaxSGEs": attr.max_sges, "MaxCQs": attr.max_cqs, "MaxCQEs": attr.max_cqes,
        "MaxPDs": attr.max_pds, "MaxMRs": attr.max_mrs, "MaxMWs": attr.max_mws,
        "MaxSRQs": attr.max_srqs, "MaxInline": attr.max_inline,
        "MaxMRSize": attr.max_mr_size, "Atomicity": attr.atomicity.name,
        "NotSupported": missing,
        "ports": [{
            "PortNum": p.port_num, "PortState": p.link_state.name,
            "LinkLayer": p.link_layer.value, "PortGUID": guid(p.port_guid), "LID": p.lid,
            "LMC": p.lmc, "MasterSMLID": p.sm_lid, "ActiveMTU": p.active_mtu.bytes,
            "MaxMTU": p.max_mtu.bytes, "LinkWidthActive": p.active_width,
            "LinkSpeedActive": p.active_speed, "CapabilityMask": int(p.cap),
            "PKeys": list(p.pkeys),
            "GIDs": [{"Index": e.index, "GID": str(e.gid), "Type": e.gid_type.value,
                      "NetDev": e.netdev or None} for e in p.gid_table],
        } for p in attr.ports],
    }  # fmt: skip


def perftest_json(test: str, result: Any) -> dict[str, Any]:
    """perftest's result table as numbers (bandwidth MB = 2^20 bytes; latency in us)."""
    import statistics

    if hasattr(result, "samples"):
        s: list[float] = sorted(result.samples)

        def pct(p: float) -> float:
            import math

            return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

        return {"Test": test, "Bytes": result.size, "Iterations": result.iters,
                "TMin": s[0], "TMax": s[-1], "TTypical": statistics.median(s),
                "TAvg": statistics.fmean(s), "TStdev": statistics.pstdev(s) if len(s) > 1
                else 0.0, "P99": pct(0.99), "P99_9": pct(0.999)}  # fmt: skip
    return {"Test": test, "Bytes": result.size, "Iterations": result.iters,
            "BWPeakMBps": result.peak_mb, "BWAverageMBps": result.avg_mb,
            "MsgRateMpps": result.mpps}  # fmt: skip
