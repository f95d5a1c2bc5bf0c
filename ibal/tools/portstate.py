"""``ibal ibportstate``: a port's state, width and speed, and changing them.

As infiniband-diags' ``ibportstate TARGET PORT [OP [VALUE]]...``: the query
prints the PortInfo highlights (and, for an active switch port, the peer's,
with a warning when the link runs below what both ends enable); an operation
reads the PortInfo, sets the fields it changes (state and physical state NOP
otherwise, the enabled width and speed always: 0 is NOP) and sends it back
(SubnSet), then prints what the port answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import click

from ibal.mad.rpc import MadClient, MadError, PortId
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options
from ibal.wire.mad import smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["OPS", "VALUE_OPS", "PeerError", "apply_ops", "ibportstate_cmd", "parse_ops",
           "show_port_info"]  # fmt: skip

OPS: Final = ("query", "enable", "reset", "disable", "down", "arm", "active", "on", "off")
# op: (PortInfo field, largest value, smallest) (espeed, fdr10, mkey*: not supported)
VALUE_OPS: Final = {"speed": ("link_speed_enabled", 15, 0),
                    "width": ("link_width_enabled", 255, 0),
                    "vls": ("operational_vls", 5, 1), "mtu": ("neighbor_mtu", 5, 1),
                    "lid": ("lid", 0xBFFF, 1), "smlid": ("master_sm_lid", 0xBFFF, 1),
                    "lmc": ("lmc", 7, 0)}  # fmt: skip
_CAP_EXT_SPEEDS: Final = int(smp.CapabilityMask.IS_EXTENDED_SPEEDS_SUPPORTED)
_ROWS: Final = (("LinkState", "port_state", "portstate"),
                ("PhysLinkState", "port_phys_state", "physportstate"),
                ("Lid", "lid", "uint"), ("SMLid", "master_sm_lid", "uint"), ("LMC", "lmc", "uint"),
                ("LinkWidthSupported", "link_width_supported", "linkwidthsup"),
                ("LinkWidthEnabled", "link_width_enabled", "linkwidthen"),
                ("LinkWidthActive", "link_width_active", "linkwidth"),
                ("LinkSpeedSupported", "link_speed_supported", "linkspeedsup"),
                ("LinkSpeedEnabled", "link_speed_enabled", "linkspeeden"),
                ("LinkSpeedActive", "link_speed_active", "linkspeed"))  # fmt: skip
_EXT_ROWS: Final = (("LinkSpeedExtSupported", "link_speed_ext_supported", "linkspeedextsup"),
                    ("LinkSpeedExtEnabled", "link_speed_ext_enabled", "linkspeedexten"),
                    ("LinkSpeedExtActive", "link_speed_ext_active", "linkspeedext"))  # fmt: skip


class PeerError(MadError):
    """The peer of an active switch port did not answer; ``text`` is what came before."""

    def __init__(self, text: str, message: str) -> None:
        super().__init__(message)
        self.text = text


def parse_ops(args: Sequence[str]) -> tuple[str, dict[str, int]]:
    """The operation and the values to set, from ibportstate's trailing words."""
    op = ""
    values: dict[str, int] = {}
    words = list(args)
    while words:
        w = words.pop(0)
        if w in OPS:
            if op:
                raise MadError(f"{w} only one of: query, enable, disable, reset, down, arm, "
                               "active, can be specified")  # fmt: skip
            op = w
            continue
        if w not in VALUE_OPS:
            raise MadError(f"invalid operation: {w}")
        if not words:
            raise MadError(f"{w} requires an additional parameter")
        try:
            v = int(words.pop(0), 0)
        except ValueError:
            v = 0
        _, top, low = VALUE_OPS[w]
        if not low <= v <= top or (w == "width" and 31 < v < 255):
            raise MadError(f"invalid {w} value {v:#x}" if w in ("lid", "smlid")
                           else f"invalid {w} value {v}")  # fmt: skip
        values[w] = v
    return op or "query", values


def _espeed_cap(client: MadClient, to: PortId, is_switch: bool, pi: dict[str, Any]) -> bool:
    info = pi
    if is_switch:
        info = dict(smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, to, 0)))
    return bool(int(info["capability_mask"]) & _CAP_EXT_SPEEDS)


def show_port_info(to: PortId, data: bytes, port: int, espeed: bool, is_switch: bool) -> str:
    """ibportstate's "# Port info" block."""
    from ibal.wire.mad import dump

    rows = _ROWS + (_EXT_ROWS if espeed else ())
    lines = dump.fields(smp.PORT_INFO, rows, data)
    if not is_switch or port == 0:
        d = smp.PORT_INFO.decode(data)
        lines += [dump.field_line("Mkey", dump.NOT_DISPLAYED),
                  dump.field_line("MkeyLeasePeriod", str(int(d["m_key_lease_period"]))),
                  dump.field_line("ProtectBits", str(int(d["m_key_protect_bits"])))]  # fmt: skip
    return f"# Port info: {to} port {port}\n" + "".join(line + "\n" for line in lines)


def _peer_warnings(me: dict[str, Any], peer: dict[str, Any]) -> list[str]:
    """The warnings ibportstate prints when a link runs below what both ends enable."""
    out = []
    width = me["link_width_enabled"] if me["link_width_enabled"] != 255 else me[
        "link_width_supported"]  # fmt: skip
    pw = peer["link_width_enabled"] if peer["link_width_enabled"] != 255 else peer[
        "link_width_supported"]  # fmt: skip
    lwa = int(me["link_width_active"])
    for bit, name in ((8, "12x"), (4, "8x"), (2, "4x"), (16, "2x"), (1, "1x")):
        if width & pw & bit:
            if lwa != bit:
                out.append(f"Peer ports operating at active width {lwa} rather than {bit} "
                           f"({name})")  # fmt: skip
            break
    speed = me["link_speed_enabled"] if me["link_speed_enabled"] != 15 else me[
        "link_speed_supported"]  # fmt: skip
    ps = peer["link_speed_enabled"] if peer["link_speed_enabled"] != 15 else peer[
        "link_speed_supported"]  # fmt: skip
    lsa = int(me["link_speed_active"])
    for bit, name in ((4, "10.0 Gbps"), (2, "5.0 Gbps"), (1, "2.5 Gbps")):
        if speed & ps & bit:
            if lsa != bit:
                out.append(f"Peer ports operating at active speed {lsa} rather than {bit} "
                           f"({name})")  # fmt: skip
            break
    return out


def apply_ops(client: MadClient, to: PortId, port: int, op: str,
              values: dict[str, int]) -> tuple[str, list[str], dict[str, Any]]:  # fmt: skip
    """Run ``ibportstate``: its text, its warnings, and the port's PortInfo at the end."""
    ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO, to))
    is_switch = ni["node_type"] == smp.NodeType.SWITCH
    data = bytes(client.smp_get(SmpAttr.PORT_INFO, to, port))
    pi = dict(smp.PORT_INFO.decode(data))
    espeed = _espeed_cap(client, to, is_switch, pi)
    kind = "Switch" if is_switch else "CA/RT"
    changing = op != "query" or bool(values)
    text = f"{'Initial ' if changing else ''}{kind} PortInfo:\n"
    text += show_port_info(to, data, port, espeed, is_switch)
    warnings: list[str] = []
    if changing:
        new = dict(pi)
        phys = int(pi["port_phys_state"])
        if "lid" not in values and int(pi["lid"]) in (0, 0xFFFF):
            new["lid"] = 0x1234  # the SMA refuses an invalid LID: something valid
        if "smlid" not in values and int(pi["master_sm_lid"]) in (0, 0xFFFF):
            new["master_sm_lid"] = 0x1234
        new["port_state"], new["port_phys_state"] = 0, 0  # no change
        if op == "on" and phys != 3:
            return text + "Port is already in enable state\n", warnings, pi
        if op in ("on", "enable", "reset"):
            new["port_phys_state"] = 2  # Polling
        elif op in ("off", "disable"):
            text += "Disable may be irreversible\n"
            new["port_phys_state"] = 3
        elif op in ("down", "arm", "active"):
            new["port_state"] = {"down": 1, "arm": 3, "active": 4}[op]
        new["link_speed_enabled"] = values.get("speed", 0)
        new["link_speed_ext_enabled"] = 0
        new["link_width_enabled"] = values.get("width", 0)
        for name in ("vls", "mtu", "lid", "smlid", "lmc"):
            if name in values:
                new[VALUE_OPS[name][0]] = values[name]
        mod = port | (1 << 31 if espeed else 0)
        got = bytes(client.smp_set(SmpAttr.PORT_INFO, to, smp.PORT_INFO.encode(new), mod))
        text += "\nAfter PortInfo set:\n" + show_port_info(to, got, port, espeed, is_switch)
        return text, warnings, dict(smp.PORT_INFO.decode(got))
    if is_switch and port and int(pi["port_state"]) == 4 and to.directed:
        peer_to = PortId(dr_path=(*(to.dr_path or ()), port))
        try:
            pni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO, peer_to))
        except MadError as exc:  # as ibportstate: the port's part printed, then the error
            raise PeerError(text, f"smp query nodeinfo failed ({exc})") from exc
        peer_switch = pni["node_type"] == smp.NodeType.SWITCH
        pport = int(pni["local_port_num"])
        pdata = bytes(client.smp_get(SmpAttr.PORT_INFO, peer_to, pport))
        ppi = dict(smp.PORT_INFO.decode(pdata))
        text += "Peer PortInfo:\n" + show_port_info(
            peer_to, pdata, pport, _espeed_cap(client, peer_to, peer_switch, ppi), peer_switch)
        warnings = _peer_warnings(pi, ppi)
    elif is_switch and port and int(pi["port_state"]) == 4:
        # ibportstate reaches the peer of a LID-routed switch by a LID-routed-then-directed
        # SMP; ibal's client sends those, ibsim does not answer them: ask by DR path
        raise MadError("the peer of a switch port given by LID: give the switch by -D path")
    return text, warnings, pi


@click.command("ibportstate")
@click.argument("target")
@click.argument("portnum", type=int)
@click.argument("ops", nargs=-1)
@click.option("-D", "--Direct", "directed", is_flag=True, help="TARGET is a DR path (0,1,3).")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@fabric_options()
def ibportstate_cmd(target: str, portnum: int, ops: tuple[str, ...], directed: bool,
                    by_guid: bool, as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibportstate: TARGET's port PORTNUM: query [default], enable, disable, reset, on, off,
    down, arm, active, speed N, width N, vls N, mtu N, lid N, smlid N, lmc N."""
    from ibal.tools import cliopts

    try:
        op, values = parse_ops(ops)
    except MadError as exc:
        raise click.ClickException(str(exc)) from None
    with fabric_client("ibportstate", kw) as client:
        to = cliopts.resolve_target(client, target, directed, by_guid)
        try:
            text, warnings, pi = apply_ops(client, to, portnum, op, values)
        except PeerError as exc:
            if not as_json:
                click.echo(exc.text, nl=False)
            raise click.ClickException(str(exc)) from exc
    for w in warnings:
        click.echo(f"ibwarn: {w}", err=True)
    if as_json:
        emit_json({"PortNum": portnum, "Operation": op, "Set": values, "PortInfo": {
            label: int(pi[name]) for label, name, _ in _ROWS + _EXT_ROWS},
            "Warnings": warnings})  # fmt: skip
        return
    click.echo(text, nl=False)
