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

__all__ = ["OPS", "VALUE_OPS", "PeerError", "apply_ops", "ibportstate_cmd",
           "mlnx_ext_port_info", "parse_ops", "show_mlnx_ext_port_info",
           "show_port_info"]  # fmt: skip

OPS: Final = ("query", "enable", "reset", "disable", "down", "arm", "active", "on", "off")
# op: (PortInfo field, largest value, smallest); fdr10 is Mellanox's ExtendedPortInfo's
VALUE_OPS: Final = {"speed": ("link_speed_enabled", 15, 0),
                    "espeed": ("link_speed_ext_enabled", 31, 0),
                    "fdr10": ("", 1, 0),
                    "width": ("link_width_enabled", 255, 0),
                    "vls": ("operational_vls", 5, 1), "mtu": ("neighbor_mtu", 5, 1),
                    "lid": ("lid", 0xBFFF, 1), "smlid": ("master_sm_lid", 0xBFFF, 1),
                    "lmc": ("lmc", 7, 0),
                    "mkey": ("m_key", (1 << 64) - 1, 0),
                    "mkeylease": ("m_key_lease_period", 0xFFFF, 0),
                    "mkeyprot": ("m_key_protect_bits", 3, 0)}  # fmt: skip
# ibportstate's words for a value out of range
_INVALID: Final = {"espeed": "invalid extended speed value {v}",
                   "fdr10": "invalid fdr10 speed value {v}",
                   "lid": "invalid lid value {v:#x}", "smlid": "invalid smlid value {v:#x}",
                   "mkeylease": "invalid mkey lease time {v}",
                   "mkeyprot": "invalid mkey protection bit setting {v}"}  # fmt: skip
_MKEY_OPS: Final = ("mkey", "mkeylease", "mkeyprot")
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
        word = words.pop(0)
        try:
            v = int(word, 0)
        except ValueError:  # strtoull: no digits is 0; a new M_Key is asked for instead
            v = _ask_mkey() if w == "mkey" else 0
        _, top, low = VALUE_OPS[w]
        if not low <= v <= top or (w == "width" and 31 < v < 255):
            raise MadError(_INVALID.get(w, f"invalid {w} value {{v}}").format(v=v))
        values[w] = v
    return op or "query", values


def _ask_mkey() -> int:
    """``mkey`` given as a word that is no number: ibportstate asks for it, unechoed."""
    import getpass

    try:
        return int(getpass.getpass("New M_Key: "), 0)
    except ValueError:
        raise MadError("Bad new M_Key") from None


def mlnx_ext_port_info(vendor_id: int, device_id: int) -> bool:
    """Whether a node has Mellanox's ExtendedPortInfo: the device IDs infiniband-diags
    knows (``is_mlnx_ext_port_info_supported``: SwitchX and later switches, ConnectX-3
    and later CAs, and Bull's)."""
    d = device_id
    if 0xC738 <= d <= 0xC73B or d in (0xC839, 0xCB20, 0xCF08, 0xCF09, 0xD2F0):
        return True
    if 0x1003 <= d <= 0x101B or d == 0xA2D2:
        return True
    return vendor_id == 0x119F and (
        d in (0x1B02, 0x1B50, 0x1BA0, 0x1BF0, 0x1B33, 0x1B73, 0x1B40, 0x1B41, 0x1B60, 0x1B61,
              0x1B83, 0x1B93, 0x1B94, 0x1BB4, 0x1BB5)
        or 0x1BD0 <= d <= 0x1BD5 or 0x1BC4 <= d <= 0x1BC6)  # fmt: skip


def show_mlnx_ext_port_info(to: PortId, data: bytes, port: int) -> str:
    """ibportstate's "# MLNX ext Port info" block."""
    from ibal.wire.mad import dump

    d = smp.MLNX_EXT_PORT_INFO.decode(data)
    rows = (("StateChangeEnable", "state_change_enable"),
            ("LinkSpeedSupported", "link_speed_supported"),
            ("LinkSpeedEnabled", "link_speed_enabled"),
            ("LinkSpeedActive", "link_speed_active"))  # fmt: skip
    lines = [dump.field_line(label, f"0x{int(d[name]):02x}") for label, name in rows]
    return f"# MLNX ext Port info: {to} port {port}\n" + "".join(ln + "\n" for ln in lines)


def _espeed_cap(client: MadClient, to: PortId, is_switch: bool, pi: dict[str, Any]) -> bool:
    info = pi
    if is_switch:
        info = dict(smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, to, 0)))
    return bool(int(info["capability_mask"]) & _CAP_EXT_SPEEDS)


def show_port_info(to: PortId, data: bytes, port: int, espeed: bool, is_switch: bool,
                   show_keys: bool = False) -> str:  # fmt: skip
    """ibportstate's "# Port info" block (``show_keys``: ``-K``, the M_Key itself)."""
    from ibal.wire.mad import dump

    rows = _ROWS + (_EXT_ROWS if espeed else ())
    lines = dump.fields(smp.PORT_INFO, rows, data)
    if not is_switch or port == 0:
        d = smp.PORT_INFO.decode(data)
        key = f"0x{int(d['m_key']):016x}" if show_keys else dump.NOT_DISPLAYED
        lines += [dump.field_line("Mkey", key),
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


def apply_ops(client: MadClient, to: PortId, port: int, op: str, values: dict[str, int],
              show_keys: bool = False) -> tuple[str, list[str], dict[str, Any]]:  # fmt: skip
    """Run ``ibportstate``: its text, its warnings, and the port's PortInfo at the end."""
    ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO, to))
    is_switch = ni["node_type"] == smp.NodeType.SWITCH
    if is_switch and port and any(k in values for k in _MKEY_OPS):
        raise MadError("Can't set M_Key fields on switch port != 0")
    data = bytes(client.smp_get(SmpAttr.PORT_INFO, to, port))
    pi = dict(smp.PORT_INFO.decode(data))
    espeed = _espeed_cap(client, to, is_switch, pi)
    kind = "Switch" if is_switch else "CA/RT"
    changing = op != "query" or bool(values)
    text = f"{'Initial ' if changing else ''}{kind} PortInfo:\n"
    text += show_port_info(to, data, port, espeed, is_switch, show_keys)
    ext = bytes(smp.MLNX_EXT_PORT_INFO.size)
    if mlnx_ext_port_info(int(ni["vendor_id"]), int(ni["device_id"])):
        ext = bytes(client.smp_get(SmpAttr.MLNX_EXT_PORT_INFO, to, port))
        text += show_mlnx_ext_port_info(to, ext, port)
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
        new["link_speed_ext_enabled"] = values.get("espeed", 0) & 0x1F
        new["link_width_enabled"] = values.get("width", 0)
        for name in ("vls", "mtu", "lid", "smlid", "lmc", *_MKEY_OPS):
            if name in values:
                new[VALUE_OPS[name][0]] = values[name]
        if "fdr10" in values:  # as ibportstate: before the PortInfo, whatever the device
            e = dict(smp.MLNX_EXT_PORT_INFO.decode(ext))
            e["state_change_enable"], e["link_speed_enabled"] = 1, values["fdr10"]
            try:
                got_ext = bytes(client.smp_set(SmpAttr.MLNX_EXT_PORT_INFO, to,
                                               smp.MLNX_EXT_PORT_INFO.encode(e), port))
            except MadError as exc:
                raise MadError(f"smp set MLNX ext portinfo failed ({exc})") from exc
            text += "\nAfter MLNXExtendedPortInfo set:\n" + show_mlnx_ext_port_info(
                to, got_ext, port)  # fmt: skip
        mod = port | (1 << 31 if espeed else 0)
        got = bytes(client.smp_set(SmpAttr.PORT_INFO, to, smp.PORT_INFO.encode(new), mod))
        text += "\nAfter PortInfo set:\n" + show_port_info(to, got, port, espeed, is_switch,
                                                           show_keys)  # fmt: skip
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
            peer_to, pdata, pport, _espeed_cap(client, peer_to, peer_switch, ppi), peer_switch,
            show_keys)  # fmt: skip
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
@click.option("-K", "--show_keys", is_flag=True, help="Show the M_Key instead of hiding it.")
@fabric_options()
def ibportstate_cmd(target: str, portnum: int, ops: tuple[str, ...], directed: bool,
                    by_guid: bool, show_keys: bool, as_json: bool,
                    **kw: Any) -> None:  # fmt: skip
    """ibportstate: TARGET's port PORTNUM: query [default], enable, disable, reset, on, off,
    down, arm, active, speed N, espeed N, fdr10 N, width N, vls N, mtu N, lid N, smlid N,
    lmc N, mkey N, mkeylease N, mkeyprot N."""
    from ibal.tools import cliopts

    try:
        op, values = parse_ops(ops)
    except MadError as exc:
        raise click.ClickException(str(exc)) from None
    with fabric_client("ibportstate", kw) as client:
        to = cliopts.resolve_target(client, target, directed, by_guid)
        try:
            text, warnings, pi = apply_ops(client, to, portnum, op, values, show_keys)
        except PeerError as exc:
            if not as_json:
                click.echo(exc.text, nl=False)
            raise click.ClickException(str(exc)) from exc
    for w in warnings:
        click.echo(f"ibwarn: {w}", err=True)
    if as_json:
        shown: dict[str, Any] = dict(values)
        if "mkey" in shown:  # 64 bits: a string, as every key in ibal's JSON
            shown["mkey"] = f"0x{values['mkey']:016x}"
        emit_json({"PortNum": portnum, "Operation": op, "Set": shown, "PortInfo": {
            label: int(pi[name]) for label, name, _ in _ROWS + _EXT_ROWS},
            "Warnings": warnings})  # fmt: skip
        return
    click.echo(text, nl=False)
