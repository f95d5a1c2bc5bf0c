"""``ibal ibping`` and ``ibal ibsysstat``: infiniband-diags' OpenIB vendor classes.

``ibping`` (class 0x32): the client sends Get(attribute 0) with the OUI
(default OpenIB's 00:14:05) in the vendor range 2 header and prints the
answer's data (the server's host and domain name) and the round trip.
``ibsysstat`` (class 0x33): Get of attribute 0x10 (ping), 0x11 (host and
domain name) or 0x12 (each CPU's model and MHz, from ``/proc/cpuinfo``).
The servers (:class:`VendorServer`; ``-S``: :func:`ping_server`,
:func:`sysstat_server`) answer every such Get on their port's QP1, as
``ibping -S`` and ``ibsysstat -S`` do, until stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import click

from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.mad.rpc import MadClient, PortId, Request
from ibal.records import record
from ibal.status import IbError
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options
from ibal.wire.mad import header
from ibal.wire.mad.consts import Method

__all__ = ["PING_CLASS", "SYSSTAT_CLASS", "PingStats", "VendorServer", "cpu_info",
           "host_and_domain", "ibping_cmd", "ibsysstat_cmd", "ping", "ping_server", "sysstat",
           "sysstat_reply", "sysstat_server"]  # fmt: skip

PING_CLASS: Final = 0x32
SYSSTAT_CLASS: Final = 0x33
PING_ATTR, HOSTINFO_ATTR, CPUINFO_ATTR = 0x10, 0x11, 0x12
SYSSTAT_ATTRS: Final = {"ping": PING_ATTR, "host": HOSTINFO_ATTR, "cpu": CPUINFO_ATTR}
MAX_CPUS: Final = 8
OPENIB_OUI: Final = 0x001405
_DATA: Final = 40  # IB_VENDOR_RANGE2_DATA_OFFS: after the RMPP header and the OUI
_SIZE: Final = 256 - _DATA


def host_and_domain() -> str:
    """``gethostname()`` and, if set, ``.getdomainname()``: what ``ibping -S`` answers."""
    host = socket.gethostname()
    buf = ctypes.create_string_buffer(_SIZE)
    try:
        libc = ctypes.CDLL(None)
        ok = libc.getdomainname(buf, _SIZE) == 0
    except (OSError, AttributeError):
        ok = False
    domain = buf.value.decode("latin-1") if ok else "?domainname?"
    return f"{host}.{domain}" if domain else host


class VendorServer:
    """Answers Gets of a vendor range 2 class on one port (its QP1 alias) with what
    ``reply(attribute ID)`` gives (at most one MAD's data); :meth:`close` stops."""

    def __init__(self, ca: Any, port_guid: int, mgmt_class: int,
                 reply: Callable[[int], bytes], oui: int = OPENIB_OUI) -> None:  # fmt: skip
        from ibal.types import QpType

        self.answered = 0
        self.dropped = 0
        self._reply = reply
        self._pd = ca.alloc_pd()
        try:
            alias = self._pd.get_spl_qp(port_guid, QpType.QP1_ALIAS)
            svc = MadSvc(mgmt_class, 1, self._on_recv, self._on_sent,
                         methods=frozenset({Method.GET}), support_unsol=True,
                         oui=0 if oui == OPENIB_OUI else oui)  # fmt: skip
            self.service: MadService = reg_mad_svc(alias, svc)
        except BaseException:
            with contextlib.suppress(IbError):
                self._pd.dealloc()
            raise

    def _on_recv(self, e: MadElement) -> None:
        if e.request is not None:  # a response to a send of ours: a server sends none
            put_mad([e, e.request])
            return
        mad = bytes(e.mad)
        try:
            answer = self._reply(int.from_bytes(mad[16:18], "big"))[:_SIZE]
            body = mad[24:_DATA] + answer.ljust(_SIZE, b"\0")  # RMPP header and OUI kept
            out = header.respond(mad, data=body)
        except ValueError:  # a short or malformed request (FieldError): dropped, counted
            self.dropped += 1
            put_mad(e)
            return
        e.mad[:] = out
        e.resp_expected = False
        try:
            self.service.send(e)
        except IbError:
            put_mad(e)
            return
        self.answered += 1

    def _on_sent(self, e: MadElement) -> None:
        put_mad(e)

    def close(self) -> None:
        with contextlib.suppress(IbError):
            self._pd.dealloc()


def ping_server(ca: Any, port_guid: int, name: str, oui: int = OPENIB_OUI) -> VendorServer:
    """``ibping -S``: every ping answered with ``name`` (its host and domain)."""
    data = name.encode("latin-1")[: _SIZE - 1]
    return VendorServer(ca, port_guid, PING_CLASS, lambda _attr: data, oui)


def cpu_info(text: str) -> list[tuple[str, str]]:
    """Each processor's model name and MHz from ``/proc/cpuinfo``'s text (at most 8)."""
    cpus: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("processor\t"):
            cpus.append(["", ""])
            continue
        if not cpus or ":" not in line:
            continue
        value = line.split(":", 1)[1]
        if line.startswith("model name\t"):
            cpus[-1][0] = value
        elif line.startswith("cpu MHz\t"):
            cpus[-1][1] = value
    return [(m, h) for m, h in cpus[:MAX_CPUS]]


def sysstat_reply(attr: int) -> bytes:
    """``ibsysstat -S``'s answer to ``attr``."""
    if attr == HOSTINFO_ATTR:
        return host_and_domain().encode("latin-1")
    if attr == CPUINFO_ATTR:
        try:
            with open("/proc/cpuinfo", encoding="latin-1") as f:
                cpus = cpu_info(f.read())
        except OSError:
            cpus = []
        text = "".join(f"cpu {i}: model {m} MHZ {h}\n" for i, (m, h) in enumerate(cpus))
        return text.encode("latin-1")
    return b""


def sysstat_server(ca: Any, port_guid: int, oui: int = OPENIB_OUI) -> VendorServer:
    """``ibsysstat -S``: ping, host and CPU answers."""
    return VendorServer(ca, port_guid, SYSSTAT_CLASS, sysstat_reply, oui)


@record
class PingStats:
    """What a run of pings got (round trips in seconds)."""

    host: str = ""
    sent: int = 0
    received: int = 0
    rtts: list[float] | None = None


def ping(client: MadClient, to: PortId, oui: int = OPENIB_OUI) -> tuple[str, float] | None:
    """One ping: the server's name and the round trip (s); ``None`` without an answer."""
    data = bytes(13) + oui.to_bytes(3, "big")  # RMPP header (none), reserved, OUI
    t = time.perf_counter()
    rep = client.call(Request(PING_CLASS, Method.GET, 0, to, 0, data))
    rtt = time.perf_counter() - t
    if rep.mad is None or rep.status != 0:
        return None
    return rep.mad[_DATA:].split(b"\0", 1)[0].decode("latin-1"), rtt


def _ms(seconds: float) -> str:
    us = int(seconds * 1e6)
    return f"{us // 1000}.{us % 1000:03d}"


def run_pings(client: MadClient, to: PortId, count: int, *, flood: bool, oui: int,
              out: Callable[[str], None], stop: threading.Event) -> PingStats:  # fmt: skip
    """ibping's loop: ``count`` pings (0: until ``stop``), a second apart unless ``flood``."""
    stats = PingStats(rtts=[])
    assert stats.rtts is not None
    while (count == 0 or stats.sent < count) and not stop.is_set():
        stats.sent += 1
        got = ping(client, to, oui)
        if got is not None:
            name, rtt = got
            stats.host = stats.host or name
            stats.received += 1
            stats.rtts.append(rtt)
            if not flood:
                out(f"Pong from {name} ({to}): time {_ms(rtt)} ms")
        if not flood:
            stop.wait(1.0)  # ibping's pace: a second after each ping, the last one too
    return stats


def report(stats: PingStats, to: PortId, seconds: float) -> list[str]:
    """ibping's closing statistics."""
    rtts = stats.rtts or []
    lost = stats.sent - stats.received
    loss = lost * 100 // stats.sent if stats.sent and lost else 0
    mn = _ms(min(rtts)) if rtts else "0.000"
    avg = _ms(sum(rtts) / len(rtts)) if rtts else "0.000"
    mx = _ms(max(rtts)) if rtts else "0.000"
    return ["", f"--- {stats.host} ({to}) ibping statistics ---",
            f"{stats.sent} packets transmitted, {stats.received} received, {loss}% packet loss, "
            f"time {int(seconds * 1000)} ms", f"rtt min/avg/max = {mn}/{avg}/{mx} ms"]  # fmt: skip


@click.command("ibping")
@click.argument("target", required=False)
@click.option("-c", "--count", type=int, default=0, help="Stop after COUNT pings.")
@click.option("-f", "--flood", is_flag=True, help="Flood: no pause, no per-ping lines.")
@click.option("--oui", "oui", default=hex(OPENIB_OUI), show_default=True,
              help="The vendor OUI (ibping's -o: -o is ibal's provider option).")  # fmt: skip
@click.option("-S", "--Server", "server", is_flag=True, help="Serve pings until interrupted.")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@fabric_options()
def ibping_cmd(target: str | None, count: int, flood: bool, oui: str, server: bool,
               by_guid: bool, as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibping: ping TARGET (a LID, or -G a port GUID) over the OpenIB ping class; -S serve."""
    import signal

    from ibal.tools import cliopts

    try:
        oui_num = int(oui, 0)
    except ValueError:
        raise click.ClickException(f"bad OUI {oui}") from None
    if not server and target is None:
        raise click.UsageError("give the destination LID (or -S to serve)")
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with fabric_client("ibping", kw, lean=not server) as client:
            if server:
                port: Any = client.port  # an AL port: its CA and GUID
                srv = ping_server(port.ca, port.port_guid, host_and_domain(), oui_num)
                try:
                    stop.wait()
                finally:
                    srv.close()
                return
            to = cliopts.resolve_target(client, target or "", False, by_guid)
            t0 = time.perf_counter()
            stats = run_pings(client, to, count, flood=flood, oui=oui_num, out=click.echo,
                              stop=stop)  # fmt: skip
            took = time.perf_counter() - t0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if as_json:
        emit_json({"Target": str(to), "Host": stats.host, "Transmitted": stats.sent,
                   "Received": stats.received, "RTTs": stats.rtts or []})  # fmt: skip
        return
    click.echo("".join(line + "\n" for line in report(stats, to, took)), nl=False)



def sysstat(client: MadClient, to: PortId, attr: int, oui: int = OPENIB_OUI) -> str:
    """What ``ibsysstat TARGET [ping|host|cpu]`` prints; ``MadError`` without an answer."""
    from ibal.mad.rpc import MadError

    data = bytes(13) + oui.to_bytes(3, "big")
    rep = client.call(Request(SYSSTAT_CLASS, Method.GET, attr, to, 0, data))
    if rep.mad is None or rep.status != 0:
        raise MadError(f"ibsystat to {to}: {rep.error()}")
    if attr == PING_ATTR:
        return "sysstat ping succeeded\n"
    return rep.mad[_DATA:].split(b"\0", 1)[0].decode("latin-1") + "\n"  # puts()


@click.command("ibsysstat")
@click.argument("target", required=False)
@click.argument("op", required=False, type=click.Choice(list(SYSSTAT_ATTRS)))
@click.option("--oui", "oui", default=hex(OPENIB_OUI), show_default=True,
              help="The vendor OUI (ibsysstat's -o: -o is ibal's provider option).")  # fmt: skip
@click.option("-S", "--Server", "server", is_flag=True, help="Serve until interrupted.")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@fabric_options()
def ibsysstat_cmd(target: str | None, op: str | None, oui: str, server: bool, by_guid: bool,
                  as_json: bool, **kw: Any) -> None:  # fmt: skip
    """ibsysstat: ping, host name or CPUs of TARGET's ibsysstat server; -S serve."""
    import signal

    from ibal.tools import cliopts

    try:
        oui_num = int(oui, 0)
    except ValueError:
        raise click.ClickException(f"bad OUI {oui}") from None
    if not server and target is None:
        raise click.UsageError("give the destination LID (or -S to serve)")
    with fabric_client("ibsysstat", kw, lean=not server) as client:
        if server:
            stop = threading.Event()
            old = {s: signal.signal(s, lambda *_: stop.set())
                   for s in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
            port: Any = client.port  # an AL port: its CA and GUID
            srv = sysstat_server(port.ca, port.port_guid, oui_num)
            try:
                stop.wait()
            finally:
                srv.close()
                for s, handler in old.items():
                    signal.signal(s, handler)
            return
        to = cliopts.resolve_target(client, target or "", False, by_guid)
        attr = SYSSTAT_ATTRS[op or "ping"]
        text = sysstat(client, to, attr, oui_num)
    if as_json:
        emit_json({"Target": str(to), "Attribute": op or "ping",
                   "Answer": "" if attr == PING_ATTR else text[:-1]})  # fmt: skip
        return
    click.echo(text, nl=False)
