"""``ibal ibaddr`` and ``ibal smpdump``: a port's addresses, one SMP attribute raw.

``ibaddr`` asks the target's NodeInfo (its port GUID) and PortInfo (GID
prefix, LID, LMC) and prints the GID and LID range as infiniband-diags'
``ibaddr`` does; ``smpdump`` prints an attribute's 64 bytes as libibmad's
``xdump`` does (16 bytes a line, 2-byte words), then a non-zero SMP status.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import click

from ibal.mad.rpc import MadClient, MadError, PortId, smp_request
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid
from ibal.wire.mad import header, smp
from ibal.wire.mad.consts import SmpAttr

__all__ = ["ibaddr", "ibaddr_cmd", "ibaddr_text", "smpdump_cmd", "smpdump_text"]


def ibaddr(client: MadClient, to: PortId) -> dict[str, Any]:
    """The target port's PortGUID, GID, LID, LMC and last LID (a switch: its port 0)."""
    ni = smp.NODE_INFO.decode(client.smp_get(SmpAttr.NODE_INFO, to))
    pi = smp.PORT_INFO.decode(client.smp_get(SmpAttr.PORT_INFO, to, 0))
    port_guid = int(ni["port_guid"])
    gid = int(pi["gid_prefix"]).to_bytes(8, "big") + port_guid.to_bytes(8, "big")
    lid, lmc = int(pi["lid"]), int(pi["lmc"])
    return {"PortGUID": port_guid, "GID": str(ipaddress.IPv6Address(gid)), "LID": lid,
            "LMC": lmc, "LIDEnd": lid + (1 << lmc) - 1}  # fmt: skip


def ibaddr_text(info: dict[str, Any], *, show_gid: bool, show_lid: int) -> str:
    """ibaddr's line: ``show_lid`` 1 hex (``-l``), -1 decimal (``-L``), 0 none."""
    out = ""
    if show_gid:
        out += f"GID {info['GID']} "
    if show_lid > 0:
        out += f"LID start 0x{info['LID']:x} end 0x{info['LIDEnd']:x}"
    elif show_lid < 0:
        out += f"LID start {info['LID']} end {info['LIDEnd']}"
    return out + "\n"


@click.command("ibaddr")
@click.argument("target", required=False)
@click.option("-g", "--gid_show", "gid_show", is_flag=True, help="Show the GID.")
@click.option("-l", "--lid_show", "lid_show", is_flag=True, help="Show the LID range (hex).")
@click.option("-L", "--Lid_show", "lid_dec", is_flag=True, help="Show the LID range (decimal).")
@click.option("-D", "--Direct", "directed", is_flag=True, help="TARGET is a DR path (0,1,3).")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@fabric_options()
def ibaddr_cmd(target: str | None, gid_show: bool, lid_show: bool, lid_dec: bool,
               directed: bool, by_guid: bool, as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibaddr: the GID and LID range of TARGET's port [default: this port]."""
    from ibal.tools import cliopts

    with fabric_client("ibaddr", kw) as client:
        to = (PortId(dr_path=()) if target is None
              else cliopts.resolve_target(client, target, directed, by_guid))  # fmt: skip
        info = ibaddr(client, to)
    if as_json:
        emit_json({**info, "PortGUID": guid(info["PortGUID"])})
        return
    show_lid = -1 if lid_dec else 1 if lid_show else 0
    if not gid_show and not show_lid:  # as ibaddr: neither asked for, both shown
        gid_show, show_lid = True, 1
    click.echo(ibaddr_text(info, show_gid=gid_show, show_lid=show_lid), nl=False)


def smpdump_text(data: bytes, status: int, *, string: bool = False) -> str:
    """smpdump's output of an attribute's data and the SMP's status word."""
    if string:
        out = data.split(b"\0", 1)[0].decode("latin-1") + "\n"
    else:
        words = [data[i : i + 2].hex() for i in range(0, len(data), 2)]
        out = "".join(" ".join(words[i : i + 8]) + "\n" for i in range(0, len(words), 8))
    if status:
        out += f"SMP status: 0x{status:x}\n"
    return out


def _num(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise click.ClickException(f"bad {what} {text}") from None


@click.command("smpdump")
@click.argument("target")
@click.argument("attr")
@click.argument("mod", required=False, default="0")
@click.option("-s", "--string", "string", is_flag=True, help="Print the data as a string.")
@click.option("-D", "--Direct", "directed", is_flag=True, help="TARGET is a DR path (0,1,3).")
@fabric_options()
def smpdump_cmd(target: str, attr: str, mod: str, string: bool, directed: bool, as_json: bool,
                **kw: Any) -> None:  # fmt: skip
    """smpdump: SubnGet(ATTR, MOD) of TARGET (a LID, or with -D a DR path), its data in hex."""
    from ibal.tools import cliopts

    attr_id, attr_mod = _num(attr, "attribute"), _num(mod, "modifier")
    with fabric_client("smpdump", kw) as client:
        to = cliopts.resolve_target(client, target, directed, False)
        rep = client.call(smp_request(attr_id, to, attr_mod))
        if rep.mad is None:
            raise MadError(rep.error())
    status = int.from_bytes(rep.mad[4:6], "big")
    data = bytes(header.payload(rep.mad))
    if as_json:
        emit_json({"AttributeID": attr_id, "AttributeModifier": attr_mod, "Status": status,
                   "Data": data.hex()})  # fmt: skip
        return
    click.echo(smpdump_text(data, status, string=string), nl=False)
