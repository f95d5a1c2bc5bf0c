"""The ibal rxe provider on the host against kernel rxe in the lab guest.

The host end is an ibal rxe device bound to the tap's address inside the lab's
namespace; the guest runs the unmodified ``ibv_rc_pingpong`` /
``ibv_ud_pingpong`` and a pyverbs QP on its kernel ``rxe0``.  Kernel rxe drops
frames with a bad ICRC silently, so every exchange that completes proves the
provider's send path, and the provider checks the ICRC of every frame it takes.

One guest boot (2 CPUs) for the module.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ibal.lab import Lab, LabSession
from ibal.lab.pytest_plugin import lab_requires

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PP_PORT = 18515


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        reason = f"{tool} missing (apt-get install {package})"
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def link(ibal_lab: Lab) -> Iterator[LabSession]:
    lab_requires("net", "pyverbs")
    _need("ibv_rc_pingpong", "ibverbs-utils")
    _need("ss", "iproute2")
    if os.geteuid() != 0:
        pytest.skip("the rxe provider's raw sockets need root")
    lab = Lab(kernel=ibal_lab.kernel_spec, cache_dir=ibal_lab.cache_dir, cpus=2)
    with lab.session(net=True) as s:
        yield s


def _addrs(s: LabSession) -> tuple[str, str]:
    cfg = s.net_config
    assert cfg is not None
    return cfg.host_ip, cfg.guest_ip


# ------------------------------------------------------------------ pingpong


def _ibal(s: LabSession, ud: bool) -> list[str]:
    host_ip, _ = _addrs(s)
    # One address: its IPv4-mapped GID is index 0 of the ibal device.
    return [sys.executable, "-m", "ibal.cli", "pingpong", "--provider", "rxe",
            "-o", f"devices=rxe0={host_ip}", "-d", "rxe0", "-g", "0",
            *(["--ud"] if ud else [])]  # fmt: skip


@dataclass
class Side:
    rc: int
    out: str
    err: str


def _host_listening(s: LabSession, port: int) -> bool:
    r = s.host_run(["ss", "-Hltn", f"sport = :{port}"], timeout=30, text=True)
    return str(port) in r.stdout


def ibal_server(s: LabSession, ibal: list[str], theirs: list[str]) -> tuple[Side, Side]:
    """ibal pingpong serves on the host, the real tool connects from the guest."""
    host_ip, _ = _addrs(s)
    srv = s.host_popen(ibal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while not _host_listening(s, PP_PORT):  # polled, with a bound: the server is starting
        assert srv.poll() is None and time.monotonic() < deadline, srv.communicate()
        time.sleep(0.1)
    cli = s.run([*theirs, host_ip], timeout=240)
    try:
        out, err = srv.communicate(timeout=240 if cli.returncode == 0 else 10)
    except subprocess.TimeoutExpired:
        srv.kill()
        out, err = srv.communicate()
    return Side(srv.returncode, out, err), Side(cli.returncode, cli.stdout_text, cli.stderr_text)


def ibv_server(s: LabSession, ibal: list[str], theirs: list[str]) -> tuple[Side, Side]:
    """The real tool serves in the guest, ibal pingpong connects from the host."""
    _, guest_ip = _addrs(s)
    srv = s.guest_start(theirs, timeout=300)
    deadline = time.monotonic() + 60
    while True:  # retried while the guest's server is not listening yet (bounded)
        cli = s.host_run([*ibal, guest_ip], timeout=240, text=True, cwd=REPO)
        if cli.returncode == 0 or "Couldn't connect" not in cli.stderr:
            break
        assert not srv.done() and time.monotonic() < deadline, cli.stderr
        time.sleep(0.2)
    if cli.returncode != 0 and not srv.done():
        srv.kill()
    r = srv.wait()
    theirs_side = Side(r.returncode, r.stdout_text, r.stderr_text)
    return theirs_side, Side(cli.returncode, cli.stdout, cli.stderr)


ADDR = re.compile(
    r"(local|remote) address: +LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] "
    r"GID (\S+)"
)


def check(server: Side, client: Side, size: int, iters: int, host_ip: str, guest_ip: str) -> None:
    for name, side in (("server", server), ("client", client)):
        assert side.rc == 0, f"{name} exited {side.rc}: {side.err}\n{side.out}"
        assert f"{size * iters * 2} bytes in " in side.out, side.out
        assert re.search(rf"^{iters} iters in [0-9.]+ seconds = [0-9.]+ usec/iter$", side.out, re.M)
    srv = {m[0]: m[1:] for m in ADDR.findall(server.out)}
    cli = {m[0]: m[1:] for m in ADDR.findall(client.out)}
    assert srv["remote"] == cli["local"] and cli["remote"] == srv["local"]
    gids = {ipaddress.IPv6Address(srv["local"][2]), ipaddress.IPv6Address(cli["local"][2])}
    want = {ipaddress.IPv6Address(f"::ffff:{ip}") for ip in (host_ip, guest_ip)}
    assert gids == want


def pingpong_both_ways(s: LabSession, tool: str, sizes: list[int]) -> None:
    host_ip, guest_ip = _addrs(s)
    for size in sizes:
        iters = 3 if size >= 1 << 20 else 10
        args = ["-s", str(size), "-n", str(iters)]
        ibal = _ibal(s, tool == "ibv_ud_pingpong") + args
        theirs = [tool, "-d", "rxe0", "-g", "1", *args]
        for run in (ibal_server, ibv_server):
            server, client = run(s, ibal, theirs)
            try:
                check(server, client, size, iters, host_ip, guest_ip)
            except AssertionError as exc:
                raise AssertionError(f"{run.__name__} {tool} -s {size}: {exc}") from None


@pytest.mark.timeout(1800)
def test_rc_pingpong_ibal_rxe_and_kernel_rxe_both_ways(link: LabSession) -> None:
    pingpong_both_ways(link, "ibv_rc_pingpong", [1, 4096, 65536, 1 << 20])


@pytest.mark.timeout(900)
def test_ud_pingpong_ibal_rxe_and_kernel_rxe_both_ways(link: LabSession) -> None:
    pingpong_both_ways(link, "ibv_ud_pingpong", [1, 1024])
