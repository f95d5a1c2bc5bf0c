"""``ibal ibstat`` and ``ibal ibstatus``: this node's CAs and ports, as the C tool and the
script print them.

Both read the CA's attributes (``Ca.query``); on an InfiniBand port the port's
state, physical state, LIDs, capability mask and rate come from its own SMA
(PortInfo by directed route to the local port, what the kernel's sysfs shows),
on an Ethernet (RoCE) port from the port attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import click

from ibal.records import record
from ibal.tools.diagcli import emit_json, guid

__all__ = ["PortStatus", "ibstat_cmd", "ibstat_text", "ibstatus_cmd", "ibstatus_text",
           "read_cas"]  # fmt: skip

_STATES: Final = ("???", "Down", "Initializing", "Armed", "Active")
_KSTATES: Final = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
_PHYS: Final = ("No state change", "Sleep", "Polling", "Disabled", "PortConfigurationTraining",
                "LinkUp", "LinkErrorRecovery", "Phy Test")  # fmt: skip
_WIDTHS: Final = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
_SPEEDS: Final = {1: 2.5, 2: 5.0, 4: 10.0}
_EXT_SPEEDS: Final = {1: 14.0, 2: 25.0, 4: 50.0, 8: 100.0}
_SPEED_NAMES: Final = {2.5: "SDR", 5.0: "DDR", 10.0: "QDR", 14.0: "FDR", 25.0: "EDR", 50.0: "HDR",
                       100.0: "NDR"}  # fmt: skip


@record
class PortStatus:
    """One port, in the IBA's terms (PortInfo's fields; GIDs as the port's table)."""

    port_num: int
    port_state: int
    port_phys_state: int
    lid: int
    lmc: int
    sm_lid: int
    capability_mask: int
    port_guid: int
    link_layer: str
    lanes: int
    gbps: float
    gid0: bytes


@record
class CaStatus:
    name: str
    ca_type: str
    fw_version: str
    hw_version: str
    node_guid: int
    system_image_guid: int
    ports: list[PortStatus]


def _gbps(text: str) -> float:
    try:
        value = float(text.split()[0])
    except (ValueError, IndexError):
        return 0.0
    return {14.0625: 14.0, 25.78125: 25.0, 53.125: 50.0, 106.25: 100.0}.get(value, value)


def _lanes(text: str) -> int:
    try:
        return int(text.rstrip("xX"))
    except ValueError:
        return 0


def _from_sma(ca: Any, attr: Any) -> dict[str, Any] | None:
    """The port's PortInfo from its own SMA; ``None`` if it does not answer."""
    from ibal.mad.rpc import AlMadPort, MadClient, MadError, PortId
    from ibal.wire.mad import smp
    from ibal.wire.mad.consts import SmpAttr

    client = MadClient(AlMadPort(ca, attr.port_num, attr.port_guid, attr.lid, attr.sm_lid,
                                 owns_ca=False), timeout_ms=200, retries=1)  # fmt: skip
    try:
        return dict(smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, PortId(dr_path=()))))
    except MadError:
        return None
    finally:
        client.close()


def _port(ca: Any, p: Any) -> PortStatus:
    eth = p.link_layer.value == "Ethernet"
    gid0 = p.gids[0].packed if p.gids else bytes(16)
    pi = None if eth else _from_sma(ca, p)
    if pi is None:
        state = int(p.link_state) if int(p.link_state) < 5 else 4
        phys = 5 if state >= 2 else 3  # no PortInfo: what the link state implies
        return PortStatus(p.port_num, state, phys, p.lid, p.lmc, p.sm_lid, int(p.cap),
                          p.port_guid, p.link_layer.value, _lanes(p.active_width),
                          _gbps(p.active_speed), gid0)  # fmt: skip
    cap = int(pi["capability_mask"])
    ext = int(pi["link_speed_ext_active"]) if cap & (1 << 14) else 0
    speed = _EXT_SPEEDS.get(ext) or _SPEEDS.get(int(pi["link_speed_active"]), 0.0)
    return PortStatus(p.port_num, int(pi["port_state"]), int(pi["port_phys_state"]),
                      int(pi["lid"]), int(pi["lmc"]), int(pi["master_sm_lid"]), cap,
                      p.port_guid, p.link_layer.value,
                      _WIDTHS.get(int(pi["link_width_active"]), 0), speed, gid0)  # fmt: skip


def read_cas(al: Any, names: Sequence[str] = ()) -> list[CaStatus]:
    """Every CA of ``al`` (or those named: name or GUID), its ports in order."""
    out = []
    for g in al.get_ca_guids():
        ca = al.open_ca(g)
        try:
            if names and not {ca.name, f"{g:016x}", hex(g)} & set(names):
                continue
            attr = ca.query()
            kind = f"MT{attr.device_id}" if attr.vendor_id == 0x02C9 else ca.provider_name
            out.append(CaStatus(ca.name, kind, attr.fw_version, f"{attr.revision:x}",
                                attr.ca_guid, attr.system_image_guid,
                                [_port(ca, p) for p in attr.ports]))  # fmt: skip
        finally:
            ca.close(wait=True)
    return out


def _rate(p: PortStatus) -> str:
    r = p.lanes * p.gbps
    return "2.5" if r == 2.5 else f"{int(r)}"


def _name(table: Sequence[str], i: int) -> str:
    return table[i] if 0 <= i < len(table) else "???"


def _port_lines(p: PortStatus, tab: str) -> list[str]:
    return [f"{tab}State: {_name(_STATES, p.port_state)}",
            f"{tab}Physical state: {_name(_PHYS, p.port_phys_state)}",
            f"{tab}Rate: {_rate(p)}", f"{tab}Base lid: {p.lid}", f"{tab}LMC: {p.lmc}",
            f"{tab}SM lid: {p.sm_lid}", f"{tab}Capability mask: 0x{p.capability_mask:08x}",
            f"{tab}Port GUID: 0x{p.port_guid:016x}",
            f"{tab}Link layer: {p.link_layer}"]  # fmt: skip


def ibstat_text(cas: Sequence[CaStatus], *, short: bool = False, port: int | None = None) -> str:
    """ibstat's text: each CA and its ports (``short``: no ports); with ``port`` (``ibstat
    CA PORT``), that port alone, untabbed."""
    lines: list[str] = []
    for ca in cas:
        if port is not None:
            p = next((q for q in ca.ports if q.port_num == port), None)
            if p is None:
                raise click.ClickException(f"'{ca.name}' has no port {port}")
            lines += [f"CA: '{ca.name}'", f"Port {port}:", *_port_lines(p, "")]
            continue
        lines += [f"CA '{ca.name}'", f"\tCA type: {ca.ca_type}",
                  f"\tNumber of ports: {len(ca.ports)}", f"\tFirmware version: {ca.fw_version}",
                  f"\tHardware version: {ca.hw_version}",
                  f"\tNode GUID: 0x{ca.node_guid:016x}",
                  f"\tSystem image GUID: 0x{ca.system_image_guid:016x}"]  # fmt: skip
        if not short:
            for p in ca.ports:
                lines += [f"\tPort {p.port_num}:", *_port_lines(p, "\t\t")]
    return "".join(line + "\n" for line in lines)


def _gid_text(gid: bytes) -> str:
    h = gid.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def ibstatus_text(cas: Sequence[CaStatus], port: int | None = None) -> str:
    """The ibstatus script's text (its sysfs files' formats)."""
    out = []
    for ca in cas:
        for p in ca.ports:
            if port is not None and p.port_num != port:
                continue
            r = p.lanes * p.gbps
            rate = f"{r:g} Gb/sec ({p.lanes}X" + (
                f" {_SPEED_NAMES[p.gbps]})" if p.gbps > 10 else ")")
            out += [f"Infiniband device '{ca.name}' port {p.port_num} status:",
                    f"\tdefault gid:\t {_gid_text(p.gid0)}", f"\tbase lid:\t 0x{p.lid:x}",
                    f"\tsm lid:\t\t 0x{p.sm_lid:x}",
                    f"\tstate:\t\t {p.port_state}: {_name(_KSTATES, p.port_state)}",
                    f"\tphys state:\t {p.port_phys_state}: {_name(_PHYS, p.port_phys_state)}",
                    f"\trate:\t\t {rate}", f"\tlink_layer:\t {p.link_layer}", ""]  # fmt: skip
    return "".join(line + "\n" for line in out)


def _json(cas: Sequence[CaStatus]) -> dict[str, Any]:
    import ipaddress

    return {"cas": [{
        "CAName": ca.name, "CAType": ca.ca_type, "NumPorts": len(ca.ports),
        "FirmwareVersion": ca.fw_version, "HardwareVersion": ca.hw_version,
        "NodeGUID": guid(ca.node_guid), "SystemImageGUID": guid(ca.system_image_guid),
        "ports": [{
            "PortNum": p.port_num, "PortState": _name(_STATES, p.port_state),
            "PortPhysicalState": _name(_PHYS, p.port_phys_state),
            "Rate": p.lanes * p.gbps, "LinkWidthActive": f"{p.lanes}X",
            "LID": p.lid, "LMC": p.lmc, "MasterSMLID": p.sm_lid,
            "CapabilityMask": p.capability_mask, "PortGUID": guid(p.port_guid),
            "LinkLayer": p.link_layer, "GID0": str(ipaddress.IPv6Address(p.gid0)),
        } for p in ca.ports],
    } for ca in cas]}  # fmt: skip


def _open(kw: dict[str, Any]) -> Any:
    from ibal.tools import cliopts

    providers = cliopts.tool_providers(kw["providers"])
    return cliopts.open_al(providers, cliopts.parse_options(kw["options"]))


_COMMON = [
    click.option("--provider", "providers", multiple=True, help="Provider to run on "
                 "(repeatable; default IBAL_PROVIDERS, else the real ones)."),
    click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE."),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable output "
                 "(schema: docs/tools.md)."),
]  # fmt: skip


def _common(fn: Any) -> Any:
    for opt in reversed(_COMMON):
        fn = opt(fn)
    return fn


@click.command("ibstat")
@click.argument("ca_name", required=False)
@click.argument("portnum", type=int, required=False)
@click.option("-l", "--list_of_cas", "list_cas", is_flag=True, help="List the CA names.")
@click.option("-s", "--short", is_flag=True, help="The CAs without their ports.")
@click.option("-p", "--port_list", "port_list", is_flag=True, help="List the port GUIDs.")
@_common
def ibstat_cmd(ca_name: str | None, portnum: int | None, list_cas: bool, short: bool,
               port_list: bool, as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibstat: the CAs of this node and their ports [CA_NAME [PORTNUM]]."""
    with _open(kw) as (_, al):
        cas = read_cas(al, [ca_name] if ca_name else [])
    if ca_name and not cas:
        raise click.ClickException(f"'{ca_name}' IB device can't be found")
    if as_json:
        emit_json(_json(cas))
    elif list_cas:
        click.echo("".join(f"{ca.name}\n" for ca in cas), nl=False)
    elif port_list:
        click.echo("".join(f"0x{p.port_guid:016x}\n" for ca in cas for p in ca.ports), nl=False)
    else:
        click.echo(ibstat_text(cas, short=short, port=portnum), nl=False)


@click.command("ibstatus")
@click.argument("devices", nargs=-1, metavar="[DEVNAME[:PORTNUM]]...")
@_common
def ibstatus_cmd(devices: tuple[str, ...], as_json: bool, **kw: Any) -> None:
    """ibstatus: the state of each port [of DEVNAME, or its PORTNUM]."""
    with _open(kw) as (_, al):
        every = read_cas(al)
    chosen: list[tuple[CaStatus, int | None]] = []
    if not devices:
        chosen = [(ca, None) for ca in every]
    else:
        for d in devices:
            name, sep, num = d.partition(":")
            ca = next((c for c in every if c.name == name), None)
            if ca is None:
                raise click.ClickException(f"device '{name}': not found")
            chosen.append((ca, int(num) if sep and num.isdigit() else None))
    if not chosen:
        raise click.ClickException("No devices")
    if as_json:
        emit_json(_json([c for c, _ in chosen]))
        return
    click.echo("".join(ibstatus_text([c], n) for c, n in chosen), nl=False)
