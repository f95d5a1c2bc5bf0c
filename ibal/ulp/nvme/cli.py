"""``ibal nvme``: discover, connect (and read or write blocks), serve.

``--provider NAME`` (repeatable, default ``IBAL_PROVIDERS`` or the default set)
and ``-o KEY=VALUE`` choose the RDMA devices as the other ``ibal`` tools do, e.g.
``--provider rxe -o devices=rxe0=10.99.0.1``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

import ibal
from ibal.al import AccessLayer
from ibal.status import IbError
from ibal.ulp.nvme import wire as w

_PROVIDER_HELP = "Provider to run on (repeatable; default IBAL_PROVIDERS, else the real ones)."


@contextmanager
def _al(providers: tuple[str, ...], options: tuple[str, ...]) -> Iterator[AccessLayer]:
    names = providers or tuple(n.strip() for n in os.environ.get("IBAL_PROVIDERS", "").split(",")
                               if n.strip())  # fmt: skip
    opts: dict[str, Any] = {}
    for pair in options:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE")
        try:
            opts[key] = json.loads(value)
        except ValueError:
            opts[key] = value
    try:
        al = ibal.open_al({n: opts for n in names} if names else None)
    except (IbError, ValueError, TypeError) as exc:
        raise click.ClickException(f"providers: {exc}") from exc
    try:
        yield al
    finally:
        al.close()


def _common(f: Any) -> Any:
    f = click.option("--provider", "providers", multiple=True, help=_PROVIDER_HELP)(f)
    f = click.option("-o", "--option", "options", multiple=True,
                     help="Provider option KEY=VALUE.")(f)  # fmt: skip
    return f


@click.group()
def nvme() -> None:
    """NVMe over Fabrics (RDMA): an ibal host and target."""


@nvme.command()
@click.option("-a", "--traddr", required=True, help="The target's address.")
@click.option("-s", "--trsvcid", type=int, default=w.NVMF_PORT, show_default=True, help="Port.")
@click.option("-w", "--host-traddr", "src", help="This host's address.")
@_common
def discover(traddr: str, trsvcid: int, src: str | None, providers: tuple[str, ...],
             options: tuple[str, ...]) -> None:  # fmt: skip
    """The discovery controller's log page (as ``nvme discover``)."""
    from ibal.ulp.nvme.host import HostOptions
    from ibal.ulp.nvme.host import discover as run

    with _al(providers, options) as al:
        try:
            entries = run(al, traddr, HostOptions(port=trsvcid), src=src)
        except IbError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"\nDiscovery Log Number of Records {len(entries)}")
    for i, e in enumerate(entries):
        click.echo(f"=====Discovery Log Entry {i}======\ntrtype:  {e.trtype}\n"
                   f"adrfam:  {e.adrfam}\nsubtype: {e.subtype}\nportid:  {e.portid}\n"
                   f"trsvcid: {e.trsvcid}\nsubnqn:  {e.subnqn}\ntraddr:  {e.traddr}")  # fmt: skip


@nvme.command()
@click.option("-a", "--traddr", required=True, help="The target's address.")
@click.option("-s", "--trsvcid", type=int, default=w.NVMF_PORT, show_default=True, help="Port.")
@click.option("-n", "--nqn", required=True, help="The subsystem's NQN.")
@click.option("-w", "--host-traddr", "src", help="This host's address.")
@click.option("-i", "--nr-io-queues", "queues", type=int, default=1, show_default=True)
@click.option("-Q", "--queue-size", type=int, default=32, show_default=True)
@click.option("--nsid", type=int, default=1, show_default=True)
@click.option("--read", "read_", help="SLBA:NBLOCKS to read to stdout.")
@click.option("--write", "write_", type=int, help="SLBA to write stdin's blocks at.")
@_common
def connect(traddr: str, trsvcid: int, nqn: str, src: str | None, queues: int, queue_size: int,
            nsid: int, read_: str | None, write_: int | None, providers: tuple[str, ...],
            options: tuple[str, ...]) -> None:  # fmt: skip
    """Connect to a subsystem, print its controller and namespace, read or write blocks,
    disconnect."""
    from ibal.ulp.nvme.host import Controller, HostOptions

    with _al(providers, options) as al:
        try:
            opts = HostOptions(port=trsvcid, io_queues=queues, queue_size=queue_size)
            with Controller(al, traddr, nqn, opts, src=src) as ctrl:
                dev = ctrl.namespace(nsid)
                idc = ctrl.id_ctrl
                click.echo(f"cntlid {ctrl.cntlid} mn {w.nstr(idc['mn'])!r} "
                           f"sn {w.nstr(idc['sn'])!r} io-queues {len(ctrl.io)}", err=True)
                click.echo(f"nsid {nsid}: {dev.blocks} blocks of {dev.block} bytes", err=True)
                if read_:
                    slba, _, n = read_.partition(":")
                    sys.stdout.buffer.write(dev.read_blocks(int(slba), int(n or 1)))
                if write_ is not None:
                    data = sys.stdin.buffer.read()
                    dev.write_blocks(write_, data)
                    dev.flush()
        except IbError as exc:
            raise click.ClickException(str(exc)) from exc


@nvme.command()
@click.option("--file", "path", help="The namespace's backing file.")
@click.option("--mem", "mem", type=int, help="A namespace of this many bytes in memory instead.")
@click.option("--addr", required=True, help="The address to listen on.")
@click.option("-s", "--trsvcid", type=int, default=w.NVMF_PORT, show_default=True, help="Port.")
@click.option("-n", "--nqn", default="nqn.2026-12.org.ibal:target", show_default=True)
@click.option("--block", type=int, default=512, show_default=True, help="Logical block size.")
@_common
def serve(path: str | None, mem: int | None, addr: str, trsvcid: int, nqn: str, block: int,
          providers: tuple[str, ...], options: tuple[str, ...]) -> None:  # fmt: skip
    """Serve one namespace until SIGINT or SIGTERM (Linux: ``nvme connect -t rdma``)."""
    from ibal.ulp.nvme.controller import Namespace, Subsystem
    from ibal.ulp.nvme.target import Target

    if (path is None) == (mem is None):
        raise click.UsageError("give --file or --mem")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        ns = Namespace(1, path=path, size=mem or 0, block=block)
    except (IbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    subsys = Subsystem(nqn, [ns])
    with _al(providers, options) as al:
        try:
            with Target(al, subsys, addr, trsvcid):
                click.echo(f"serving {nqn} nsid 1 ({ns.blocks} blocks of {block} bytes) on "
                           f"{addr}:{trsvcid}", err=True)  # fmt: skip
                stop.wait()
        except IbError as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            subsys.close()
    for k, v in sorted(subsys.stats.items()):
        click.echo(f"{k}: {v}")
