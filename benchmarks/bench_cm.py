"""Connections set up and torn down per second: ibal's CM vs Linux rdma_cm, one lab guest.

``cmtime`` (librdmacm, rdma-core 44) connects N RC QPs at once (every REQ out
before waiting), then disconnects them all; its table gives each step's total.
``ibal cmtime`` does the same over ``ibal.cm.rdma``.  Per round, with one
guest (``--net``, 2 CPUs) and N connections:

* ``kernel``: the guest's ``cmtime`` client against the guest's ``cmtime``
  server on its eth0 address (kernel rdma_cm both ends, kernel rxe; the
  packets loop back inside the guest's kernel);
* ``ibal->kernel``: ``ibal cmtime`` on the host (userspace rxe on the tap's
  address, in the lab's namespace) against that same guest server;
* ``kernel->ibal``: the guest's ``cmtime`` client against ibal's cmtime
  server on the host;
* ``ibal<->ibal``: ``ibal cmtime`` against an ``ibal cmtime`` server in another
  process on the host, each on its own userspace rxe device on loopback
  (``127.0.0.2``, ``127.0.0.3``): ibal's CM over ibal's rxe at both ends, as the
  baseline is the kernel's at both ends.

Rates are N / the connect (or disconnect) step's total; the ratios ibal /
kernel come from the same round (>1: ibal is faster).  The guest is emulated
(TCG), the host side is native Python: the ratio says where ibal's CM stands
against this kernel on this machine, not against hardware.  In the mixed runs
the two share the machine's cores: the CPU ibal spends is taken from the
emulated guest it waits for.

``--floor RUNS`` adds, in the same boot, the floor of a Python CM
(``bench_cm_floor.py``, level ``codec``: the CM's datagrams encoded and decoded
with its field tables, no QP, no state machine) run inside the guest, beside the
kernel's figures, and on the host, beside ``ibal<->ibal``; its rows give the
floor's rate, its ratio to the kernel, and how many times the floor ibal takes.

Run from the host as root::

    python benchmarks/bench_cm.py [--connections 100] [--rounds 3] [--floor 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibal.al import AlManager  # noqa: E402
from ibal.lab import Lab, LabSession  # noqa: E402
from ibal.lab.vm import GuestJob  # noqa: E402
from ibal.providers.rxe.provider import RxeProvider  # noqa: E402
from ibal.tools.cmtime import CmtimeOptions, CmtimeServer, run_client  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cm_host import SERVER  # noqa: E402  (ibal's cmtime server in a child process)

PORT = 7471
LOOP_CLIENT, LOOP_SERVER = "127.0.0.2", "127.0.0.3"


def steps(text: str) -> dict[str, float]:
    """cmtime's table (``"%-13s: %11.2f%11.2f%11.2f%11.2f"``: wide numbers touch): step ->
    total seconds."""
    out = {}
    for line in text.splitlines():
        if len(line) >= 26 and line[13:15] == ": ":
            out[line[:13].strip()] = float(line[15:26]) / 1e3
    return out


def guest_cmtime(s: LabSession, dst: str, n: int) -> dict[str, float]:
    r = s.run(["cmtime", "-s", dst, "-c", str(n)], timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"cmtime -s {dst} failed: {r.stdout_text}{r.stderr_text}")
    out = steps(r.stdout_text)
    if "connect" not in out:
        raise RuntimeError(f"no cmtime table:\n{r.stdout_text}")
    return out


def guest_server(s: LabSession, guest_ip: str) -> GuestJob:
    """A fresh ``cmtime`` server in the guest, listening (``rdma res show cm_id``): one per
    client run, since rdma-core 44's server REJects everything after its first disconnect
    (its global QP init attribute keeps the CQs of a connection that is gone)."""
    job = s.guest_start(["cmtime", "-b", guest_ip], timeout=900)
    deadline = time.monotonic() + 60
    while True:  # bounded poll: the server is starting
        r = s.run(["rdma", "res", "show", "cm_id"], timeout=30)
        if "state LISTEN ps TCP" in r.stdout_text and f":{PORT} " in r.stdout_text:
            return job
        if job.done() or time.monotonic() > deadline:
            raise RuntimeError(f"the guest's cmtime server is not listening:\n{r.stdout_text}")
        time.sleep(0.2)


def stop(job: GuestJob) -> None:
    job.kill()
    job.wait()


def floor(run: Callable[[list[str]], str], n: int, runs: int) -> tuple[float, float]:
    """The codec floor's connect and disconnect medians (s) from ``bench_cm_floor.py``'s
    summary, the script run by ``run`` (in the guest or on the host)."""
    text = run([sys.executable if run is host_run else "python3",
                str(REPO / "benchmarks" / "bench_cm_floor.py"), "--runs", str(runs),
                "--connections", str(n)])  # fmt: skip
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "codec" and not line.startswith("run"):
            return float(words[1]) / 1e3, float(words[2]) / 1e3
    raise RuntimeError(f"no floor figures:\n{text}")


def host_run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout


def loop_server() -> subprocess.Popen[str]:
    """ibal's cmtime server in a child process on the host's loopback (root namespace)."""
    code = SERVER.format(repo=str(REPO), ip=LOOP_SERVER, port=PORT)
    srv = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert srv.stdout is not None
    if srv.stdout.readline().strip() != "listening":
        raise RuntimeError("ibal's loopback cmtime server did not start")
    return srv


def ibal_pair(loop: AlManager, n: int) -> dict[str, float]:
    al = loop.open_al()
    try:
        lines: list[str] = []
        r = run_client(al, CmtimeOptions(server=LOOP_SERVER, connections=n), out=lines.append)
        if r.failed:
            raise RuntimeError(f"ibal cmtime on loopback: {[x for x in lines if 'failed' in x]}")
        return dict(r.total)
    finally:
        al.close()


def one_round(s: LabSession, mgr: AlManager, loop: AlManager, n: int
              ) -> dict[str, dict[str, float]]:  # fmt: skip
    cfg = s.net_config
    assert cfg is not None
    host_ip, guest_ip = cfg.host_ip, cfg.guest_ip
    al = mgr.open_al()
    res: dict[str, dict[str, float]] = {}
    server = guest_server(s, guest_ip)
    try:
        res["kernel"] = guest_cmtime(s, guest_ip, n)
    finally:
        stop(server)
    server = guest_server(s, guest_ip)
    try:
        lines: list[str] = []
        r = run_client(al, CmtimeOptions(server=guest_ip, connections=n), out=lines.append)
        if r.failed:
            raise RuntimeError(f"ibal cmtime: {[x for x in lines if 'failed' in x]}")
        res["ibal->kernel"] = dict(r.total)
    finally:
        stop(server)
    with CmtimeServer(al, PORT, addr=host_ip) as srv:
        res["kernel->ibal"] = guest_cmtime(s, host_ip, n)
        if not srv.wait(lambda x: x.disconnected >= n, 120) or srv.failures():
            raise RuntimeError(f"ibal server: {srv.answered} answered, {srv.failures()} failed")
    al.close()
    res["ibal<->ibal"] = ibal_pair(loop, n)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--floor", type=int, default=0, metavar="RUNS",
                    help="also run the codec floor (this many runs) in the guest and on the host")
    args = ap.parse_args()
    n = args.connections
    rounds = []
    floors: dict[str, tuple[float, float]] = {}
    server = loop_server()
    loop = AlManager()
    loop.add_provider(RxeProvider({"devices": f"rxe_lc={LOOP_CLIENT}"}))
    with Lab(cpus=args.cpus).session(net=True) as s:
        cfg = s.net_config
        assert cfg is not None
        with s.in_netns():
            mgr = AlManager()
            mgr.add_provider(RxeProvider({"devices": f"rxe0={cfg.host_ip}"}))
        try:
            for i in range(args.rounds):
                rounds.append(one_round(s, mgr, loop, n))
                print(f"round {i + 1}: " + ", ".join(
                    f"{k} connect {v['connect'] * 1e3:.0f} ms / disconnect "
                    f"{v['disconnect'] * 1e3:.0f} ms" for k, v in rounds[-1].items()), flush=True)
            if args.floor:
                def guest_run(cmd: list[str]) -> str:
                    r = s.run(["sh", "-c", "ip link set lo up; " + " ".join(cmd)], timeout=900)
                    if r.returncode != 0:
                        raise RuntimeError(f"the floor in the guest: {r.stderr_text}")
                    return r.stdout_text

                floors["floor (guest)"] = floor(guest_run, n, args.floor)
                floors["floor (host)"] = floor(host_run, n, args.floor)
        finally:
            mgr.close()
            loop.close()
            if server.stdin is not None:
                server.stdin.close()
            server.wait(30)
    print(f"\n{n} connections per run, {len(rounds)} rounds; rates in connections/s (median)")
    print(f"{'':14s}{'connect':>10s}{'disconnect':>12s}{'ratio c.':>10s}{'ratio d.':>10s}")
    summary: dict[str, dict[str, float]] = {}
    for side in ("kernel", "ibal->kernel", "kernel->ibal", "ibal<->ibal"):
        rate = {st: statistics.median(n / r[side][st] for r in rounds)
                for st in ("connect", "disconnect")}
        ratio = {st: statistics.median(r["kernel"][st] / r[side][st] for r in rounds)
                 for st in ("connect", "disconnect")}
        summary[side] = {"connect_per_s": rate["connect"], "disconnect_per_s": rate["disconnect"],
                         "ratio_connect": ratio["connect"], "ratio_disconnect": ratio["disconnect"]}
        print(f"{side:14s}{rate['connect']:10.0f}{rate['disconnect']:12.0f}"
              f"{ratio['connect']:10.2f}{ratio['disconnect']:10.2f}")
    kernel = {st: statistics.median(r["kernel"][st] for r in rounds)
              for st in ("connect", "disconnect")}
    pair = {st: statistics.median(r["ibal<->ibal"][st] for r in rounds)
            for st in ("connect", "disconnect")}
    for side, (c, d) in floors.items():
        summary[side] = {"connect_per_s": n / c, "disconnect_per_s": n / d,
                         "ratio_connect": kernel["connect"] / c,
                         "ratio_disconnect": kernel["disconnect"] / d}
        print(f"{side:14s}{n / c:10.0f}{n / d:12.0f}{kernel['connect'] / c:10.2f}"
              f"{kernel['disconnect'] / d:10.2f}")
    if "floor (host)" in floors:
        c, d = floors["floor (host)"]
        print(f"ibal<->ibal takes {pair['connect'] / c:.1f}x the host floor's connect time, "
              f"{pair['disconnect'] / d:.1f}x its disconnect time (medians)")
    if args.json:
        args.json.write_text(json.dumps({"connections": n, "rounds": rounds, "floors": floors,
                                         "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
