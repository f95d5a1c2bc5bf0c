"""The ``ibal`` command line: devices, info, conformance, demo (and the lab)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ibal.tools.cliopts import (
    PROVIDER_HELP,
    console,
    diag_options,
    err_console,
    mad_client,
    node_name_map_option,
    open_al,
    parse_options,
    resolve_target,
    tool_providers,
)
from ibal.types import CaAttr, PortAttr

if TYPE_CHECKING:
    from ibal.al import AlManager

# Command groups imported only when asked for, and their one line in ``ibal --help``.
_GROUPS_LOADED_LATE = {
    "lab": "The kernel-rxe lab VM.",
    "nvme": "NVMe over Fabrics (RDMA): discover, connect, serve.",
}


class _Main(click.Group):
    """The ``ibal`` group; ``lab`` (and rich with it) is imported when asked for."""

    resolved: str | None = None
    """The command of the last invocation (:func:`run` asks whether it may end fast)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        self.resolved = name
        return name, cmd, rest

    def list_commands(self, ctx: click.Context) -> list[str]:
        from ibal.tools.commands import LAZY

        return sorted({*super().list_commands(ctx), "lab", "nvme", *LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "nvme" and "nvme" not in self.commands:
            from ibal.ulp.nvme.cli import nvme

            self.add_command(nvme)
        if cmd_name == "lab" and "lab" not in self.commands:
            try:
                from ibal.lab.cli import lab
            except ImportError:  # the lab is optional at import time
                return None
            self.add_command(lab)
        if cmd_name not in self.commands:
            from ibal.tools.commands import LAZY

            lazy = LAZY.get(cmd_name)
            if lazy is not None:  # the tool's module only when the tool is run
                import importlib

                self.add_command(getattr(importlib.import_module(lazy.module), lazy.attr),
                                 cmd_name)  # fmt: skip
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands under headings of what they are for, none of the lazy ones imported."""
        from ibal.tools.commands import GROUPS, LAZY, group_of

        rows: dict[str, list[tuple[str, str]]] = {}
        for name in self.list_commands(ctx):
            if name in LAZY:
                text = LAZY[name].help
            elif name in _GROUPS_LOADED_LATE:
                text = _GROUPS_LOADED_LATE[name]
            else:
                cmd = self.commands.get(name)
                text = cmd.get_short_help_str(80) if cmd else ""
            rows.setdefault(group_of(name), []).append((name, text))
        order = {n: i for _, names in GROUPS for i, n in enumerate(names)}
        for title in [t for t, _ in GROUPS] + ["Other"]:
            if title in rows:
                with formatter.section(title):
                    formatter.write_dl(sorted(rows[title], key=lambda r: order.get(r[0], 99)))


@click.group(cls=_Main)
@click.version_option(package_name="ibal")
def main() -> None:
    """ibal: an InfiniBand access layer for Python."""


@main.command()
@click.option(
    "-p", "--provider", "providers", multiple=True,
    help="Only these providers (default: the non-simulated ones; -p mock for the mock).",
)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/tools.md).")
def devices(providers: tuple[str, ...], options: tuple[str, ...], as_json: bool) -> None:
    """List the CAs every provider registered (like ibv_devices)."""
    with open_al(providers, parse_options(options)) as (mgr, al):
        if as_json:
            from ibal.tools.diagjson import devices_json, emit_json

            rows = []
            for guid in al.get_ca_guids():
                ca = al.open_ca(guid)
                rows.append((ca.name, ca.provider_name, guid, ca.query().num_ports))
                ca.close(wait=True)
            if not rows and providers:
                raise click.ClickException(f"no CA from provider(s) {', '.join(providers)}")
            return emit_json(devices_json(rows))
        from rich.table import Table

        table = Table(title="CAs")
        for col in ("device", "provider", "node GUID", "ports"):
            table.add_column(col)
        guids = al.get_ca_guids()
        for guid in guids:
            ca = al.open_ca(guid)
            attr = ca.query()
            table.add_row(ca.name, ca.provider_name, _guid(guid), str(attr.num_ports))
            ca.close(wait=True)
        if not guids and providers:
            _print_unavailable(mgr)
            raise click.ClickException(f"no CA from provider(s) {', '.join(providers)}")
        console.print(table)
        _print_unavailable(mgr)


@main.command()
@click.argument("ca_name", required=False)
@click.option("-p", "--provider", "providers", multiple=True, help="Only these providers.")
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/tools.md).")
def info(ca_name: str | None, providers: tuple[str, ...], options: tuple[str, ...],
         as_json: bool) -> None:  # fmt: skip
    """Show CA and port attributes (like ibv_devinfo / ibstat)."""
    with open_al(providers, parse_options(options)) as (mgr, al):
        shown = 0
        cas: list[Any] = []
        for guid in al.get_ca_guids():
            ca = al.open_ca(guid)
            try:
                if ca_name and ca_name not in (ca.name, _guid(guid), hex(guid)):
                    continue
                attr = ca.query()
                if as_json:
                    from ibal.tools.diagjson import info_json

                    cas.append(info_json(ca.name, ca.provider_name, attr,
                                         dict(ca.capabilities.missing())))  # fmt: skip
                    shown += 1
                    continue
                _print_ca(ca.name, ca.provider_name, attr)
                if ca.capabilities.port_counters:
                    for port in attr.ports:
                        _print_counters(port.port_num, ca.query_port_counters(port.port_num))
                missing = ca.capabilities.missing()
                if missing:
                    by_reason: dict[str, list[str]] = {}
                    for k, v in sorted(missing.items()):
                        by_reason.setdefault(v, []).append(k)
                    text = "; ".join(f"{', '.join(ks)} ({v})" for v, ks in by_reason.items())
                    console.print(
                        f"  not supported: {text}", style="dim", markup=False, soft_wrap=True
                    )
                shown += 1
            finally:
                ca.close(wait=True)
        if not shown:
            _print_unavailable(mgr)
            raise click.ClickException(f"no CA {ca_name or ''}".strip())
        if as_json:
            from ibal.tools.diagjson import emit_json

            emit_json({"cas": cas})


def _print_counters(port_num: int, counters: dict[str, int]) -> None:
    console.print(f"  [bold]port {port_num} counters[/]")
    for name, value in sorted(counters.items()):
        console.print(f"    {name:<28} {value}")


def _print_unavailable(mgr: AlManager) -> None:
    from ibal.al import SIMULATED_SKIPPED

    for name, reason in sorted(mgr.unavailable.items()):
        if reason == SIMULATED_SKIPPED:
            err_console.print(f"[dim]{name}: simulated, not started (-p {name} shows its CAs)[/]")
        else:
            err_console.print(f"[yellow]{name}[/]: no CA ({reason})")


def _guid(guid: int) -> str:
    return f"{guid:016x}"


def _print_ca(name: str, provider: str, attr: CaAttr) -> None:
    console.print(f"[bold]CA '{name}'[/] ({provider})")
    rows = [
        ("node GUID", _guid(attr.ca_guid)),
        ("system image GUID", _guid(attr.system_image_guid)),
        ("vendor / device / rev", f"0x{attr.vendor_id:x} / 0x{attr.device_id:x} / {attr.revision}"),
        ("firmware", attr.fw_version or "-"),
        ("max QP / WR / SGE", f"{attr.max_qps} / {attr.max_wrs} / {attr.max_sges}"),
        ("max CQ / CQE", f"{attr.max_cqs} / {attr.max_cqes}"),
        ("max PD / MR / MW", f"{attr.max_pds} / {attr.max_mrs} / {attr.max_mws}"),
        ("max SRQ / SRQ WR", f"{attr.max_srqs} / {attr.max_srq_wrs}"),
        ("max inline / MR size", f"{attr.max_inline} / {attr.max_mr_size}"),
        ("atomics", attr.atomicity.name),
    ]
    for key, value in rows:
        console.print(f"  {key:<22} {value}")
    for port in attr.ports:
        _print_port(port)


def _print_port(port: PortAttr) -> None:
    console.print(f"  [bold]port {port.port_num}[/]")
    rows = [
        ("state", port.link_state.name),
        ("link layer", port.link_layer.value),
        ("port GUID", _guid(port.port_guid)),
        ("LID / LMC / SM LID", f"0x{port.lid:x} / {port.lmc} / 0x{port.sm_lid:x}"),
        ("active / max MTU", f"{port.active_mtu.bytes} / {port.max_mtu.bytes}"),
        ("rate", f"{port.active_width} {port.active_speed}"),
        ("capabilities", str(port.cap).replace("PortCap.", "") or "-"),
        ("P_Keys", " ".join(f"0x{k:04x}" for k in port.pkeys)),
    ]
    for key, value in rows:
        console.print(f"    {key:<20} {value}")
    for e in port.gid_table:
        kind = e.gid_type.value + (f", {e.netdev}" if e.netdev else "")
        console.print(f"    {f'GID[{e.index}]':<20} {e.gid} ({kind})")


@main.command()
@click.argument("provider")
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("-k", "keyword", default=None, help="Only checks matching this pytest -k expression.")
@click.option("-x", "exitfirst", is_flag=True, help="Stop at the first failure.")
def conformance(
    provider: str, options: tuple[str, ...], keyword: str | None, exitfirst: bool
) -> None:
    """Run the conformance suite against PROVIDER, with progress and a summary table."""
    from ibal.testing.cli import run_cli

    extra = []
    if keyword:
        extra += ["-k", keyword]
    if exitfirst:
        extra.append("-x")
    sys.exit(run_cli(provider, parse_options(options), extra, console))


@main.command()
def demo() -> None:
    """Open the AL, build the resource tree on two mock CAs and move data with each opcode."""
    from rich.table import Table

    from ibal.demo import Step, demo_fabric, run_demo

    table = Table(title="ibal demo: every opcode between two CAs of the embedded mock fabric")
    for col in ("operation", "completions", "result", "ok"):
        table.add_column(col)

    def show(step: Step) -> None:
        comps = "\n".join(
            f"{side}: {wc.wc_type.name} {wc.status.name} len={wc.length}"
            for side, wc in step.completions
        )
        table.add_row(step.name, comps, step.check, "[green]yes[/]" if step.ok else "[red]NO[/]")

    with demo_fabric() as al:
        report = run_demo(al, show)
    console.print(f"CAs: {', '.join(report.cas)}")
    console.print(table)
    console.print(
        "[green]all operations completed and verified[/]" if report.ok else "[red]demo failed[/]"
    )
    sys.exit(0 if report.ok else 1)


@main.command()
@click.option("-p", "--provider", "providers", multiple=True, help="Only these providers.")
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("--class", "classes", default="ca,port,iou,ioc", show_default=True,
              help="PnP classes to watch, comma separated.")
@click.option("--replay/--no-replay", default=False, show_default=True,
              help="First print the current state (what a new PnP registration is told).")
def events(providers: tuple[str, ...], options: tuple[str, ...], classes: str,
           replay: bool) -> None:
    """Print PnP events as they happen, one line each (like udevadm monitor); Ctrl-C ends."""
    import signal
    import threading

    from ibal.tools.events import EventsError, monitor, parse_classes

    try:
        chosen = parse_classes(classes)
    except EventsError as exc:
        raise click.ClickException(str(exc)) from None
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    def out(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open_al(providers, parse_options(options)) as (mgr, al):
            names = ",".join(c.name.lower() for c in chosen if c.name)
            err_console.print(f"monitor: PnP events of {names} on {len(mgr.ca_guids)} CA(s)"
                              + (", current state first" if replay else ""))
            monitor(al, chosen, replay, out, stop)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@main.command()
@click.option("-p", "--port", type=int, default=18515, show_default=True, help="TCP port.")
@click.option("-d", "--ib-dev", "device", help="Device (CA name or GUID) [default: the first].")
@click.option("-i", "--ib-port", type=int, default=1, show_default=True, help="Port of the device.")
@click.option("-s", "--size", type=int, help="Message size [default: 4096, 2048 with --ud].")
@click.option("-m", "--mtu", type=int, default=1024, show_default=True, help="Path MTU (RC).")
@click.option("-r", "--rx-depth", type=int, default=500, show_default=True, help="Receives.")
@click.option("-n", "--iters", type=int, default=1000, show_default=True, help="Exchanges.")
@click.option("-l", "--sl", type=int, default=0, show_default=True, help="Service level.")
@click.option("-e", "--events", is_flag=True, help="Sleep on completion events, do not poll.")
@click.option("-g", "--gid-idx", "gid_index", type=int, help="Local GID index (RoCE: 1 = IPv4).")
@click.option("--ud", is_flag=True, help="Unreliable datagram (ibv_ud_pingpong), not RC.")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.argument("servername", required=False)
def pingpong(
    port: int,
    device: str | None,
    ib_port: int,
    size: int | None,
    mtu: int,
    rx_depth: int,
    iters: int,
    sl: int,
    events: bool,
    gid_index: int | None,
    ud: bool,
    providers: tuple[str, ...],
    options: tuple[str, ...],
    servername: str | None,
) -> None:
    """ibv_rc_pingpong (ibv_ud_pingpong with --ud): server without SERVERNAME, else client.

    Interoperates with the real tools: same options, TCP exchange and output.
    """
    from ibal.tools.pingpong import PingpongError, PingpongOptions, run

    opts = PingpongOptions(
        servername=servername, port=port, device=device, ib_port=ib_port, size=size, mtu=mtu,
        rx_depth=rx_depth, iters=iters, sl=sl, gid_index=gid_index, use_event=events, ud=ud,
    )  # fmt: skip
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            run(al, opts, out=lambda line: click.echo(line))
        except PingpongError as exc:
            raise click.ClickException(str(exc)) from exc


@main.command()
@click.option("-s", "server", flag_value=True, default=None, help="Server side.")
@click.option("-c", "server", flag_value=False, help="Client side.")
@click.option("-a", "addr", help="Address (server: to bind to; client: of the server).")
@click.option("-I", "source", help="Source address to bind to (client).")
@click.option("-p", "port", type=int, default=7174, show_default=True, help="Port.")
@click.option("-C", "count", type=int, default=0, help="Ping count [default: until stopped].")
@click.option("-S", "size", type=int, default=64, show_default=True, help="Ping data size.")
@click.option("-v", "verbose", is_flag=True, help="Display ping data.")
@click.option("-V", "validate", is_flag=True, help="Validate ping data.")
@click.option("-P", "persistent", is_flag=True,
              help="Persistent server: serve clients until SIGINT/SIGTERM, each on a thread.")
@click.option("-d", "debug", is_flag=True, help="Accepted for rping's sake.")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
def rping(
    server: bool | None,
    addr: str | None,
    source: str | None,
    port: int,
    count: int,
    size: int,
    verbose: bool,
    validate: bool,
    persistent: bool,
    debug: bool,
    providers: tuple[str, ...],
    options: tuple[str, ...],
) -> None:
    """librdmacm's rping: RDMA CM connect, then SEND/RDMA READ/RDMA WRITE pings.

    Interoperates with the real rping over RoCE (same options, protocol and output).
    """
    import signal
    import threading

    from ibal.tools.rping import RpingError, RpingOptions, run

    if server is None:
        raise click.UsageError("give -s (server) or -c (client)")
    opts = RpingOptions(server=server, addr=addr, source=source, port=port, count=count,
                        size=size, verbose=verbose, validate=validate,
                        persistent=persistent)  # fmt: skip
    stop = threading.Event()
    if persistent:  # a signal ends the listen; clients being served finish first
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            run(al, opts, out=click.echo, err=lambda line: click.echo(line, err=True),
                stop=stop)  # fmt: skip
        except RpingError as exc:
            raise click.ClickException(str(exc)) from exc


@main.command()
@click.option("-s", "server", help="Server address: run the client against it.")
@click.option("-b", "bind", help="Address to bind to (client: source; server: listen address).")
@click.option("-c", "connections", type=int, default=100, show_default=True, help="Connections.")
@click.option("-p", "port", type=int, default=7471, show_default=True, help="Port.")
@click.option("-t", "timeout_ms", type=int, default=2000, show_default=True, help="Timeout (ms).")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
def cmtime(server: str | None, bind: str | None, connections: int, port: int, timeout_ms: int,
           providers: tuple[str, ...], options: tuple[str, ...]) -> None:  # fmt: skip
    """librdmacm's cmtime: time RDMA CM connects and disconnects (server without -s).

    Interoperates with the real cmtime over RoCE; the server runs until interrupted.
    """
    import contextlib
    import threading

    from ibal.tools.cmtime import CmtimeError, CmtimeOptions, CmtimeServer, run_client

    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        if server is None:
            with CmtimeServer(al, port, addr=bind) as srv:
                with contextlib.suppress(KeyboardInterrupt):
                    threading.Event().wait()
                click.echo(f"{srv.answered} connections, {srv.disconnected} disconnected, "
                           f"{srv.failures()} failed")  # fmt: skip
            return
        opts = CmtimeOptions(server=server, bind=bind, connections=connections, port=port,
                             timeout_ms=timeout_ms)  # fmt: skip
        try:
            run_client(al, opts, out=click.echo)
        except CmtimeError as exc:
            raise click.ClickException(str(exc)) from exc


@main.command()
@click.option("-s", "server", help="Server address: run the client against it.")
@click.option("-b", "bind", help="Address to bind to (client: source; server: listen address).")
@click.option("-c", "connections", type=int, default=1, show_default=True, help="Peers.")
@click.option("-C", "count", type=int, default=10, show_default=True, help="Messages each way.")
@click.option("-S", "size", type=int, default=100, show_default=True, help="Message size.")
@click.option("-P", "port_space", type=click.Choice(["udp"], case_sensitive=False),
              default="udp", help="Port space (udp; ipoib is not supported).")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
def udaddy(server: str | None, bind: str | None, connections: int, count: int, size: int,
           port_space: str, providers: tuple[str, ...],
           options: tuple[str, ...]) -> None:  # fmt: skip
    """librdmacm's udaddy: UD datagrams to peers found by SIDR (server without -s).

    Interoperates with the real udaddy over RoCE (same options, protocol and output).
    """
    from ibal.tools.udaddy import UdaddyError, UdaddyOptions, run

    opts = UdaddyOptions(server=server, bind=bind, connections=connections, count=count,
                         size=size)  # fmt: skip
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            run(al, opts, out=click.echo)
        except UdaddyError as exc:
            raise click.ClickException(str(exc)) from exc


@main.command()
@click.option("-m", "group", required=True, help="Multicast address (IPv4 or IPv6).")
@click.option("-s", "sender", is_flag=True, help="Send (else receive).")
@click.option("-b", "bind", help="Local address to join from.")
@click.option("-c", "connections", type=int, default=1, show_default=True, help="Nodes.")
@click.option("-C", "count", type=int, default=10, show_default=True, help="Messages.")
@click.option("-S", "size", type=int, default=100, show_default=True, help="Message size.")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
def mckey(group: str, sender: bool, bind: str | None, connections: int, count: int, size: int,
          providers: tuple[str, ...], options: tuple[str, ...]) -> None:  # fmt: skip
    """librdmacm's mckey: UD datagrams to an IP multicast group over RoCE.

    Interoperates with the real mckey (same options, protocol and output); a sender
    waits 3 s after joining, as mckey does.
    """
    from ibal.tools.mckey import MckeyError, MckeyOptions, run

    opts = MckeyOptions(group=group, sender=sender, bind=bind, connections=connections,
                        count=count, size=size)  # fmt: skip
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            run(al, opts, out=click.echo)
        except MckeyError as exc:
            raise click.ClickException(str(exc)) from exc


@main.command()
@click.option("-s", "server", help="Server address: run the client against it.")
@click.option("-b", "bind", help="Address to bind to (client: source; server: listen address).")
@click.option("-c", "connections", type=int, default=1, show_default=True, help="Connections.")
@click.option("-C", "count", type=int, default=10, show_default=True, help="Messages each way.")
@click.option("-S", "size", type=int, default=100, show_default=True, help="Message size.")
@click.option("-p", "port", type=int, default=7471, show_default=True, help="Port.")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
def ucmatose(server: str | None, bind: str | None, connections: int, count: int, size: int,
             port: int, providers: tuple[str, ...], options: tuple[str, ...]) -> None:  # fmt: skip
    """librdmacm's ucmatose: RC connections, messages each way, disconnect (server without -s).

    Interoperates with the real ucmatose over RoCE (same options, protocol and output).
    """
    from ibal.tools.cmatose import CmatoseError, CmatoseOptions, run

    opts = CmatoseOptions(server=server, bind=bind, connections=connections, count=count,
                          size=size, port=port)  # fmt: skip
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            run(al, opts, out=click.echo)
        except CmatoseError as exc:
            raise click.ClickException(str(exc)) from exc


_PERFTESTS = ["write_bw", "read_bw", "send_bw", "send_lat", "write_lat"]


@main.command()
@click.argument("test", type=click.Choice(_PERFTESTS))
@click.option("-p", "--port", type=int, default=18515, show_default=True, help="TCP port.")
@click.option("-d", "--ib-dev", "device", help="Device (CA name or GUID) [default: the first].")
@click.option("-i", "--ib-port", type=int, default=1, show_default=True, help="Port of the device.")
@click.option("-s", "--size", type=int, help="Message size [default: 65536 bw, 2 lat].")
@click.option("-n", "--iters", type=int, default=1000, show_default=True, help="Iterations.")
@click.option("-t", "--tx-depth", type=int, default=128, show_default=True, help="Send window.")
@click.option("-r", "--rx-depth", type=int, default=512, show_default=True, help="Receives.")
@click.option("-Q", "--cq-mod", type=int, default=100, show_default=True, help="Signal every N.")
@click.option("-l", "--post-list", type=int, default=0, show_default=True,
              help="WRs per post_send call (bw clients; 0: the whole free window).")
@click.option("-m", "--mtu", type=int, help="Path MTU [default: the port's active MTU].")
@click.option("-x", "--gid-index", type=int, help="Local GID index (RoCE: 1 = IPv4).")
@click.option("-F", "--CPU-freq", "cpu_freq", is_flag=True, help="Accepted for perftest's sake.")
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("--json", "as_json", is_flag=True, help="The result as JSON (docs/tools.md).")
@click.argument("servername", required=False)
def perftest(
    test: str,
    port: int,
    device: str | None,
    ib_port: int,
    size: int | None,
    iters: int,
    tx_depth: int,
    rx_depth: int,
    cq_mod: int,
    post_list: int,
    mtu: int | None,
    gid_index: int | None,
    cpu_freq: bool,
    providers: tuple[str, ...],
    options: tuple[str, ...],
    as_json: bool,
    servername: str | None,
) -> None:
    """perftest's ib_TEST (write_bw, read_bw, send_bw, send_lat, write_lat) between two ibal ends.

    Server without SERVERNAME, else client; prints perftest's result table.
    """
    from ibal.tools.perftest import PerftestError, PerftestOptions, run

    opts = PerftestOptions(
        test=test, servername=servername, port=port, device=device, ib_port=ib_port, size=size,
        iters=iters, tx_depth=tx_depth, rx_depth=rx_depth, cq_mod=cq_mod, mtu=mtu,
        gid_index=gid_index, post_list=post_list,
    )  # fmt: skip
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            res = run(al, opts, out=(lambda line: None) if as_json else click.echo)
        except PerftestError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        from ibal.tools.diagjson import emit_json, perftest_json

        emit_json(perftest_json(test, res.result))


@main.command()
@click.argument("op")
@click.argument("target")
@click.argument("port", type=int, default=0)
@click.option("-D", "--Direct", "directed", is_flag=True, help="TARGET is a DR path (0,1,3).")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@node_name_map_option
@diag_options
def smpquery(
    op: str, target: str, port: int, directed: bool, by_guid: bool, node_name_map: Path | None,
    ca_name: str | None, port_num: int | None, timeout_ms: int, via: str,
    providers: tuple[str, ...], options: tuple[str, ...], as_json: bool, m_key: str | None,
) -> None:  # fmt: skip
    """smpquery: OP is nodeinfo, portinfo, nodedesc, switchinfo, pkeys or guids."""
    from ibal.tools.diags import smpquery as run

    names = None
    if node_name_map is not None or op.lower() in ("nodedesc", "nd"):  # the one op it names
        from ibal.tools.nodemap import load

        names = load(node_name_map)

    with mad_client(providers, options, ca_name, port_num, timeout_ms, via, m_key=m_key) as client:
        to = resolve_target(client, target, directed, by_guid)
        if as_json:
            from ibal.tools.diagjson import emit_json, smpquery_json

            return emit_json(smpquery_json(client, op, to, port))
        click.echo(run(client, op, to, port, names), nl=False)


@main.command()
@click.argument("target", required=False)
@click.argument("port", type=int, required=False)
@click.option("-x", "--extended", is_flag=True, help="PortCountersExtended.")
@click.option("-r", "--reset_after_read", "reset", is_flag=True, help="Reset after reading.")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@diag_options
def perfquery(
    target: str | None, port: int | None, extended: bool, reset: bool, by_guid: bool,
    ca_name: str | None, port_num: int | None, timeout_ms: int, via: str,
    providers: tuple[str, ...], options: tuple[str, ...], as_json: bool, m_key: str | None,
) -> None:  # fmt: skip
    """perfquery: port counters of TARGET's PORT [default: this port]."""
    from ibal.tools.diags import perfquery as run

    with mad_client(providers, options, ca_name, port_num, timeout_ms, via, m_key=m_key) as client:
        lid = client.port.lid
        if target is not None:
            lid = resolve_target(client, target, False, by_guid).lid
        if port is None:  # as perfquery: this port, or port 0 of a named target
            port = client.port.port_num if target is None else 0
        if as_json:
            from ibal.tools.diagjson import emit_json, perfquery_json

            return emit_json(perfquery_json(client, lid, port, extended=extended, reset=reset))
        click.echo(run(client, lid, port, extended=extended, reset=reset), nl=False)


@main.command()
@click.argument("target", required=False)
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@diag_options
def sminfo(
    target: str | None, by_guid: bool, ca_name: str | None, port_num: int | None,
    timeout_ms: int, via: str, providers: tuple[str, ...], options: tuple[str, ...],
    as_json: bool, m_key: str | None,
) -> None:  # fmt: skip
    """sminfo: the SMInfo of the subnet manager [default: the SM this port names]."""
    from ibal.tools.diags import sminfo as run

    with mad_client(providers, options, ca_name, port_num, timeout_ms, via, m_key=m_key) as client:
        to = None if target is None else resolve_target(client, target, False, by_guid)
        if as_json:
            from ibal.tools.diagjson import emit_json, sminfo_json

            return emit_json(sminfo_json(client, to))
        click.echo(run(client, to), nl=False)


def _lid_arg(text: str | None) -> int:
    try:
        return 0 if text is None else int(text, 0)  # strtoul(..., 0): 10, 0x10, 020
    except ValueError as exc:
        raise click.ClickException(f"bad LID {text}") from exc


@main.command()
@click.argument("target")
@click.argument("start", required=False)
@click.argument("end", required=False)
@click.option("-a", "--all", "all_lids", is_flag=True, help="Show invalid out ports too.")
@click.option("-n", "--no_dests", is_flag=True, help="Do not resolve destinations.")
@click.option("-M", "--Multicast", "multicast", is_flag=True,
              help="The multicast forwarding table (MLIDs).")  # fmt: skip
@click.option("-D", "--Direct", "directed", is_flag=True, help="TARGET is a DR path (0,1,3).")
@click.option("-G", "--Guid", "by_guid", is_flag=True, help="TARGET is a port GUID (via the SA).")
@node_name_map_option
@diag_options
def ibroute(
    target: str, start: str | None, end: str | None, all_lids: bool, no_dests: bool,
    multicast: bool, directed: bool, by_guid: bool, node_name_map: Path | None,
    ca_name: str | None,
    port_num: int | None, timeout_ms: int, via: str, providers: tuple[str, ...],
    options: tuple[str, ...], as_json: bool, m_key: str | None,
) -> None:  # fmt: skip
    """ibroute: the unicast (-M: multicast) forwarding table of switch TARGET [from START
    to END]."""
    from ibal.tools.diags import ibroute as run
    from ibal.tools.nodemap import load

    first, last = _lid_arg(start), _lid_arg(end)
    names = load(node_name_map)
    with mad_client(providers, options, ca_name, port_num, timeout_ms, via, m_key=m_key) as client:
        to = resolve_target(client, target, directed, by_guid)
        text = run(client, to, first, last, all_lids=all_lids, no_dests=no_dests,
                   multicast=multicast, names=names)  # fmt: skip
        if as_json:
            from ibal.tools.diagjson import emit_json
            from ibal.tools.fts import table_rows

            return emit_json({"Target": str(to), "Multicast": multicast,
                              "Table": table_rows(text, multicast)})  # fmt: skip
        click.echo(text, nl=False)


@main.command()
@click.option("-w", "--window", type=int, default=64, show_default=True,
              help="SMPs in flight at once.")  # fmt: skip
@click.option("--progress/--no-progress", default=None,
              help="Progress on stderr [default: when stderr is a terminal].")  # fmt: skip
# bare agents by default: the client matches answers and retries itself, so the
# service's pool elements and response linking are only cost (~30% of the CPU)
@click.option("-s", "--show", is_flag=True, help="Show each node as it was found first.")
@click.option("-g", "--grouping", "group", is_flag=True, help="Show grouping.")
@click.option("-l", "--list", "list_all", is_flag=True, help="List the connected nodes.")
@click.option("-H", "--Hca_list", "list_cas", is_flag=True, help="List the connected CAs.")
@click.option("-S", "--Switch_list", "list_switches", is_flag=True,
              help="List the connected switches.")  # fmt: skip
@click.option("-R", "--Router_list", "list_routers", is_flag=True,
              help="List the connected routers.")  # fmt: skip
@click.option("-p", "--ports", is_flag=True, help="A ports report.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "dot"]), default="text",
              show_default=True, help="ibnetdiscover's text, JSON, or a Graphviz graph.")
@click.option("--cache", "cache_file", type=click.Path(path_type=Path),
              help="Also write the fabric to this ibnetdiscover cache file.")  # fmt: skip
@click.option("--load-cache", "load_cache", type=click.Path(path_type=Path),
              help="Print the fabric of this cache file (no sweep).")  # fmt: skip
@node_name_map_option
@functools.partial(diag_options, via="agent")
def discover(
    window: int, progress: bool | None, show: bool, group: bool, list_all: bool,
    list_cas: bool, list_switches: bool, list_routers: bool, ports: bool, fmt: str,
    cache_file: Path | None, load_cache: Path | None, node_name_map: Path | None,
    ca_name: str | None, port_num: int | None, timeout_ms: int, via: str,
    providers: tuple[str, ...], options: tuple[str, ...], as_json: bool, m_key: str | None,
) -> None:  # fmt: skip
    """ibnetdiscover: sweep the fabric by directed route and print its topology."""
    from ibal.tools.diags import discover as run
    from ibal.tools.nodemap import load

    names = load(node_name_map)
    # as ibnetdiscover: the last of -l/-H/-S/-R given wins; click gives no order, so
    # -l (all three) takes precedence over a single type
    types = ((1, 2, 3) if list_all else (1,) if list_cas else (2,) if list_switches
             else (3,) if list_routers else ())  # fmt: skip
    if cache_file is not None or load_cache is not None:
        from ibal.tools.cache import CacheError, discover_cached

        opts: dict[str, Any] = {"show": show, "group": group, "list_types": types,
                                "ports": ports, "names": names}
        try:
            if load_cache is not None:
                return click.echo(discover_cached(None, write=None, read=load_cache, **opts),
                                  nl=False)  # fmt: skip
            with mad_client(providers, options, ca_name, port_num, timeout_ms, via,
                            m_key=m_key) as client:
                text = discover_cached(client, write=cache_file, read=None, window=window,
                                       **opts)  # fmt: skip
        except CacheError as exc:
            raise click.ClickException(str(exc)) from exc
        return click.echo(text, nl=False)
    with mad_client(providers, options, ca_name, port_num, timeout_ms, via, m_key=m_key) as client:
        if as_json or fmt != "text":
            from ibal.tools.diagjson import discover_other

            return click.echo(discover_other(client, "json" if as_json else fmt, window),
                              nl=False)  # fmt: skip
        click.echo(run(client, window=window, progress=progress, show=show, group=group,
                       list_types=types, ports=ports, names=names), nl=False)  # fmt: skip



def _num(text: str | None, default: int) -> int:
    from ibal.tools.saquery import strtoul

    return default if text is None else strtoul(text)


_SAQ_NUMS = ("slid", "dlid", "mlid", "reversible", "numb_path", "pkey", "qos_class", "sl", "mtu",
             "rate", "pkt_life", "qkey", "tclass", "flow_label", "hop_limit", "scope",
             "join_state", "proxy_join", "service_id")  # fmt: skip


def _saquery_options(fn: Any) -> Any:
    """saquery's selectors (numbers as C's strtoul reads them: 0x.., 0.., decimal)."""
    flags = [("-p", "pr", "get PathRecord info"), ("-N", "nr", "get NodeRecord info"),
             ("-L", "lids", "the LIDs of the name given"),
             ("-l", "unique_lid", "the unique LID of the name given"),
             ("-G", "guids", "the GUIDs of the name given"),
             ("-O", "name_of_lid", "the name of the LID given"),
             ("-U", "name_of_guid", "the name of the GUID given"),
             ("-s", "issm", "PortInfoRecords with IsSM or IsSMdisabled"),
             ("-g", "mcgroups", "multicast groups"), ("-m", "mcmembers", "multicast members"),
             ("-x", "lr", "get LinkRecord info"), ("-c", "cpi", "the SA's ClassPortInfo"),
             ("-S", "sr", "get ServiceRecord info"),
             ("-I", "iir", "get InformInfoRecord info")]  # fmt: skip
    values = [("--slid",), ("--dlid",), ("--mlid",), ("-r", "--reversible"),
              ("-n", "--numb_path"), ("--pkey",), ("-Q", "--qos_class"), ("--sl",),
              ("-M", "--mtu"), ("-R", "--rate"), ("--pkt_lifetime", "pkt_life"),
              ("-q", "--qkey"), ("-T", "--tclass"), ("-F", "--flow_label"),
              ("-H", "--hop_limit"), ("--scope",), ("-J", "--join_state"),
              ("-X", "--proxy_join"), ("--service_id",)]  # fmt: skip
    for decls in reversed(values):
        fn = click.option(*decls)(fn)
    for gid in ("sgid", "dgid", "gid", "mgid"):
        fn = click.option(f"--{gid}", help=f"{gid.upper()} (IPv6 notation).")(fn)
    fn = click.option("--src-to-dst", "src_to_dst", metavar="SRC:DST",
                      help="A PathRecord from SRC to DST (LIDs or node names).")(fn)
    fn = click.option("--sgid-to-dgid", "sgid_to_dgid", metavar="SGID-DGID",
                      help="A PathRecord between two GIDs (IPv6 notation).")(fn)
    fn = click.option("-D", "--list", "desc", is_flag=True, help="The node descriptions of "
                      "the CAs.")(fn)  # fmt: skip
    fn = click.option("-K", "--show_keys", is_flag=True, help="Show keys (ServiceKey, QPN).")(fn)
    for short, name, text in reversed(flags):
        fn = click.option(short, name, is_flag=True, help=f"{text[0].upper()}{text[1:]}.")(fn)
    return fn


@main.command()
@click.argument("args", nargs=-1)
@_saquery_options
@click.option("-C", "--Ca", "ca_name", help="CA name or GUID [default: the first with an "
              "active port].")  # fmt: skip
@click.option("-P", "--Port", "port_num", type=int, help="CA port [default: the first active].")
@click.option("-t", "--timeout", "timeout_ms", type=int, default=1000, show_default=True,
              help="Response time-out per try (ms).")  # fmt: skip
@click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP)
@click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE.")
@click.option("--json", "as_json", is_flag=True,
              help="Each query's records as JSON (docs/tools.md).")  # fmt: skip
def saquery(
    args: tuple[str, ...], ca_name: str | None, port_num: int | None, timeout_ms: int,
    providers: tuple[str, ...], options: tuple[str, ...], **kw: Any,
) -> None:  # fmt: skip
    """saquery: [QUERY] [ARG]: NR [lid], PIR [[lid]/[port]/[options]], SR, PR, MCMR,
    LR [[from_lid]/[port]] [[to_lid]/[port]], GIR [[lid]/[block]], IIR [gid], CPI
    (NodeRecords by default)."""
    from ibal.tools import saquery as saq
    from ibal.wire.mad.consts import SaAttr

    p = saq.Params()
    for name in _SAQ_NUMS:
        setattr(p, name, _num(kw[name], getattr(p, name)))
    try:
        for gid in ("sgid", "dgid", "gid", "mgid"):
            if kw[gid] is not None:
                setattr(p, gid, saq.parse_gid(kw[gid]))
        opts = saq.Options(args=args, show_keys=kw["show_keys"], params=p)
        for flag, attr in (("pr", SaAttr.PATH_RECORD), ("sr", SaAttr.SERVICE_RECORD),
                           ("iir", SaAttr.INFORM_INFO_RECORD), ("lr", SaAttr.LINK_RECORD)):
            if kw[flag]:
                opts.query_type = attr
        if kw["src_to_dst"] is not None:
            if ":" not in kw["src_to_dst"]:
                raise saq.SaqueryError("--src-to-dst takes SRC:DST")
            opts.src_to_dst, p.numb_path = kw["src_to_dst"], 0x7F
            opts.query_type = SaAttr.PATH_RECORD
        if kw["sgid_to_dgid"] is not None:
            sgid, sep, dgid = kw["sgid_to_dgid"].partition("-")
            if not sep:
                raise saq.SaqueryError("--sgid-to-dgid takes SGID-DGID")
            p.sgid, p.dgid, p.numb_path = saq.parse_gid(sgid), saq.parse_gid(dgid), 0x7F
            opts.query_type = SaAttr.PATH_RECORD
        for flag, how in (("desc", saq.NodePrint.ALL_DESC), ("lids", saq.NodePrint.LID_ONLY),
                          ("unique_lid", saq.NodePrint.UNIQUE_LID_ONLY),
                          ("guids", saq.NodePrint.GUID_ONLY),
                          ("name_of_lid", saq.NodePrint.NAME_OF_LID),
                          ("name_of_guid", saq.NodePrint.NAME_OF_GUID)):  # fmt: skip
            if kw[flag]:
                opts.node_print, opts.command = how, saq.Command.NODE_RECORD
        for flag, cmd in (("nr", saq.Command.NODE_RECORD), ("cpi", saq.Command.CLASS_PORT_INFO),
                          ("issm", saq.Command.ISSM), ("mcgroups", saq.Command.MCGROUPS),
                          ("mcmembers", saq.Command.MCMEMBERS)):  # fmt: skip
            if kw[flag]:
                opts.command = cmd
        with open_al(tool_providers(providers), parse_options(options)) as (_, al):
            port = saq.open_port(al, ca_name, port_num)
            try:
                ask = saq.port_asker(port, timeout_ms)
                if kw["as_json"]:
                    from ibal.tools.diagjson import emit_json, sa_recorder

                    ask, got = sa_recorder(ask)
                text = saq.saquery(ask, opts)
            finally:
                port.close()
    except saq.SaqueryError as exc:
        raise click.ClickException(str(exc)) from exc
    if kw["as_json"]:
        return emit_json({"queries": got})
    click.echo(text, nl=False)


# Commands whose resources are all closed by their ``with`` blocks and whose output
# goes through click/rich (flushed): nothing is left for the interpreter's teardown.
_FAST_EXIT = frozenset({"devices", "info", "smpquery", "perfquery", "sminfo", "ibroute",
                        "discover", "saquery"})  # fmt: skip


def run() -> None:
    """The ``ibal`` process: :func:`main`, then, after the commands in ``_FAST_EXIT``,
    an exit without the interpreter's teardown (see :func:`_exit_now`)."""
    try:
        main()
    except SystemExit as exc:
        from ibal.tools.commands import LAZY

        if main.resolved in _FAST_EXIT or main.resolved in LAZY:
            _exit_now(exc.code)
        raise


def _exit_now(code: object) -> None:
    """End the process as ``exit(3)`` does, skipping the interpreter's teardown.

    Freeing every module and object costs ~35 ms of CPU after ``discover``
    (a 1,000-node topology), more wall time under load; the process ends
    anyway.  Python's streams are
    flushed and its ``atexit`` functions run first; libc's ``exit`` then runs
    the C libraries' destructors (``os._exit`` would skip them: umad2sim's
    tells ibsim the client is gone, without it ibsim runs out of client
    slots).  Returns (the caller exits normally) while a non-daemon thread runs
    or under a tracer or profiler (coverage, cProfile write their data after
    the program returns).
    """
    import atexit
    import ctypes
    import os
    import threading

    if sys.gettrace() is not None or sys.getprofile() is not None:
        return
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # as the interpreter does with sys.exit("message")
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the interpreter's status for it
            status = 120
    try:
        # PyDLL: the GIL stays held, so no Python thread runs while libc exits.
        ctypes.PyDLL(None).exit(status)
    except (OSError, AttributeError):  # no libc symbol table (not Linux)
        os._exit(status)


if __name__ == "__main__":
    run()
