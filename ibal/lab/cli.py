"""`ibal lab`: run commands against kernel rdma_rxe in a throwaway VM."""

from __future__ import annotations

import os
import sys

import click
from rich import box
from rich.console import Console
from rich.table import Table

from ibal.lab.cluster import LinePrefixer, run_on_all
from ibal.lab.host import ALL_PURPOSES, REQUIRED_PURPOSES, LabUnavailable, check
from ibal.lab.link import LinkConfig
from ibal.lab.netns import NetConfig, cleanup_stale
from ibal.lab.vm import (
    DEFAULT_BOOT_TIMEOUT,
    Lab,
    LabError,
    LabResult,
    cleanup_stale_tempdirs,
    stream_to,
)

#: `ibal lab run`'s default --timeout.  Commands in the docs must work as written, and the
#: longest, the rdma_core conformance suite in the guest (docs/rdma-core-provider.md),
#: takes 8-25 min under TCG on a loaded host: Lab.run's 300 s killed it at about 80 %.
RUN_TIMEOUT = 3600.0

#: Exit status when the lab itself fails (as `docker run` uses 125).
EXIT_LAB_FAILURE = 125


@click.group(name="lab")
def lab() -> None:
    """A real kernel RDMA stack (rdma_rxe) in a throwaway qemu VM."""


@lab.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--net", is_flag=True, help="Link the guest (eth0) to a tap in a new network namespace."
)
@click.option(
    "--timeout",
    type=float,
    default=RUN_TIMEOUT,
    show_default=True,
    help="Seconds the command may run.",
)
@click.option(
    "--boot-timeout",
    type=float,
    default=DEFAULT_BOOT_TIMEOUT,
    show_default=True,
    help="Seconds to boot.",
)
@click.option("--cwd", help="Working directory in the guest [default: the current one].")
@click.option(
    "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Set a variable (repeatable)."
)
@click.option("--clean-env", is_flag=True, help="Start from an empty environment, not this one.")
@click.option(
    "--kernel", metavar="KVER|PATH", help="Kernel to boot [default: newest with rdma_rxe]."
)
@click.option("--memory", type=int, default=1024, show_default=True, help="Guest memory in MiB.")
@click.option("--cpus", type=int, default=1, show_default=True, help="Guest CPUs.")
@click.option(
    "--host-address", default=NetConfig.host_address, show_default=True, help="Tap address (--net)."
)
@click.option(
    "--guest-address",
    default=NetConfig.guest_address,
    show_default=True,
    help="eth0 address (--net).",
)
@click.option(
    "--peers",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="Boot this many guests on one link (rxe0 on it) and run COMMAND in each.",
)
@click.option(
    "--link-subnet",
    default=LinkConfig.subnet,
    show_default=True,
    help="Subnet of the --peers link (guest i: host address i+1).",
)
@click.option(
    "--link-mtu", type=int, default=LinkConfig.mtu, show_default=True, help="--peers link MTU."
)
@click.option("-v", "--verbose", is_flag=True, help="Report boot and run time on stderr.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(
    net: bool,
    timeout: float,
    boot_timeout: float,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    clean_env: bool,
    kernel: str | None,
    memory: int,
    cpus: int,
    host_address: str,
    guest_address: str,
    peers: int,
    link_subnet: str,
    link_mtu: int,
    verbose: bool,
    command: tuple[str, ...],
) -> None:
    """Boot a guest, run COMMAND in it, exit with its status.

    Use `--` before COMMAND when it has options of its own, e.g.
    `ibal lab run -- ibv_devinfo -d rxe0`. Output is streamed as it comes;
    a command that hits --timeout is killed and the exit status is 124.

    With --peers N, N guests boot in parallel on one virtual link and COMMAND
    runs in each at once, with IBAL_LAB_PEER (its index), IBAL_LAB_ADDRESS and
    IBAL_LAB_PEERS (every address) set; output lines are prefixed "[i] " and
    the exit status is the first non-zero one by index.
    """
    env = {} if clean_env else dict(os.environ)
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--env")
        env[name] = value
    try:
        net_config = NetConfig(host_address=host_address, guest_address=guest_address)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    the_lab = Lab(
        kernel=kernel, memory_mb=memory, cpus=cpus, net_config=net_config, boot_timeout=boot_timeout
    )
    if peers > 1:
        try:
            link = LinkConfig(subnet=link_subnet, mtu=link_mtu)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
        _run_peers(the_lab, peers, link, net, list(command), timeout, env, cwd, verbose)
        return
    try:
        result = the_lab.run(
            list(command),
            net=net,
            timeout=timeout,
            env=env,
            cwd=cwd,
            on_stdout=stream_to(sys.stdout.buffer),
            on_stderr=stream_to(sys.stderr.buffer),
        )
    except LabUnavailable as exc:
        click.echo(f"ibal lab: {exc}\nRun `ibal lab check` for what is missing.", err=True)
        sys.exit(EXIT_LAB_FAILURE)
    except LabError as exc:
        click.echo(f"ibal lab: {exc}", err=True)
        sys.exit(EXIT_LAB_FAILURE)
    if verbose:
        click.echo(
            f"ibal lab: boot {result.boot_seconds:.1f} s, command {result.run_seconds:.1f} s, "
            f"exit status {result.returncode}",
            err=True,
        )
    if result.timed_out:
        click.echo(f"ibal lab: command timed out after {timeout:g} s and was killed", err=True)
    sys.exit(result.returncode)


def _write_stream(stream: str, data: bytes) -> None:
    out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
    out.write(data)
    out.flush()


def _run_peers(
    the_lab: Lab,
    peers: int,
    link: LinkConfig,
    net: bool,
    command: list[str],
    timeout: float,
    env: dict[str, str],
    cwd: str | None,
    verbose: bool,
) -> None:
    """`run --peers N`: COMMAND in N guests on one link; exit with the first failure."""
    prefix = LinePrefixer(_write_stream, peers)
    results: list[LabResult] = []
    try:
        with the_lab.cluster(peers, link=link, net=net) as lab_cluster:
            results = run_on_all(
                lab_cluster, command, timeout=timeout, env=env, cwd=cwd, on_output=prefix
            )
            boot = lab_cluster.boot_seconds
    except LabUnavailable as exc:
        click.echo(f"ibal lab: {exc}\nRun `ibal lab check` for what is missing.", err=True)
        sys.exit(EXIT_LAB_FAILURE)
    except LabError as exc:
        prefix.flush()
        click.echo(f"ibal lab: {exc}", err=True)
        sys.exit(EXIT_LAB_FAILURE)
    prefix.flush()
    for i, r in enumerate(results):
        if verbose:
            click.echo(
                f"ibal lab: [{i}] boot {boot:.1f} s (all guests), command {r.run_seconds:.1f} s, "
                f"exit status {r.returncode}",
                err=True,
            )
        if r.timed_out:
            click.echo(f"ibal lab: [{i}] command timed out after {timeout:g} s", err=True)
    sys.exit(next((r.returncode for r in results if r.returncode != 0), 0))


@lab.command("check")
def check_cmd() -> None:
    """List what the lab needs, and the apt command for what is missing.

    Exits 1 when a required piece (boot, --net, pyverbs) is missing.
    """
    report = check()
    table = Table(title="ibal lab prerequisites", box=box.SIMPLE_HEAD)
    table.add_column("piece", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("package", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for item in report.items:
        if item.ok:
            status = "[green]ok[/]"
        elif item.purpose in REQUIRED_PURPOSES:
            status = "[red]MISSING[/]"
        else:
            status = f"[yellow]missing ({item.purpose}, optional)[/]"
        table.add_row(item.name, status, item.package or "-", item.detail)
    console = Console()
    console.print(table)
    cmd = report.apt_command(*ALL_PURPOSES)
    if cmd:
        console.print(f"Install what is missing with:\n  [bold]{cmd}[/]", soft_wrap=True)
    if report.ok:
        console.print("[green]The lab can run here.[/]")
    else:
        console.print("[red]The lab cannot run here until the required pieces are installed.[/]")
        sys.exit(1)


@lab.command("cleanup")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Also remove namespaces of lab processes still running.",
)
def cleanup_cmd(everything: bool) -> None:
    """Remove namespaces and temp dirs left behind by killed lab runs."""
    for name in cleanup_stale(all_namespaces=everything):
        click.echo(f"deleted network namespace {name}")
    for path in cleanup_stale_tempdirs():
        click.echo(f"removed {path}")


if __name__ == "__main__":
    lab()
