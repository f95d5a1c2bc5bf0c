"""ibal's CM on the host alone: CPU and time per 100 connections, client and server.

An ``ibal cmtime`` server runs in a child process on one userspace rxe device
(``--server-ip``), the client in this process on another (``--client-ip``),
both on loopback: no guest, so the figures are ibal's own cost.  Each run
connects ``--connections`` RC QPs (every REQ out before any is waited for),
then disconnects them all, as ``cmtime`` does.  Printed: the client's CPU per
run (all its threads), its context switches per run, the connect step's
median, the wall time per run, and the server's CPU over all runs.

A same-run A/B of two commits: check the other one out beside this tree
(``git worktree add /tmp/old <rev>``) and alternate
``python /tmp/old/benchmarks/bench_cm_host.py`` with this tree's script; each
runs the ``ibal`` next to it.  Run as root (the rxe devices bind 4791)::

    python benchmarks/bench_cm_host.py [--runs 10] [--connections 100]

``--count-calls`` (needs ``pip install yappi``) prints instead the client's
function calls per connection, builtins included, over every thread: a
deterministic measure of its work, where CPU figures on this machine move by
10% from run to run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibal.al import AccessLayer, AlManager  # noqa: E402
from ibal.providers.rxe.provider import RxeProvider  # noqa: E402
from ibal.tools.cmtime import CmtimeOptions, run_client  # noqa: E402

SERVER = """
import sys, time
sys.path.insert(0, {repo!r})
from ibal.al import AlManager
from ibal.providers.rxe.provider import RxeProvider
from ibal.tools.cmtime import CmtimeServer
mgr = AlManager()
mgr.add_provider(RxeProvider({{"devices": "rxe_hs={ip}"}}))
srv = CmtimeServer(mgr.open_al(), {port}, addr={ip!r})
print("listening", flush=True)
sys.stdin.read()  # until the parent closes our stdin
"""


def cpu_ms(pid: int) -> float:
    """A process's user + system CPU so far (``/proc/PID/stat``), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def count_calls(al: AccessLayer, opts: CmtimeOptions, runs: int) -> float:
    import yappi  # type: ignore[import-untyped]

    yappi.start(builtins=True)
    for _ in range(runs):
        run_client(al, opts, out=lambda _s: None)
    yappi.stop()
    calls = sum(s.ncall for s in yappi.get_func_stats())
    return float(calls) / (runs * opts.connections)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--client-ip", default="127.0.0.2")
    ap.add_argument("--server-ip", default="127.0.0.3")
    ap.add_argument("--port", type=int, default=7471)
    ap.add_argument("--count-calls", action="store_true")
    args = ap.parse_args()
    code = SERVER.format(repo=str(REPO), ip=args.server_ip, port=args.port)
    server = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    mgr = AlManager()
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise SystemExit("the server did not start")
        mgr.add_provider(RxeProvider({"devices": f"rxe_hc={args.client_ip}"}))
        al = mgr.open_al()
        opts = CmtimeOptions(server=args.server_ip, port=args.port, connections=args.connections)
        run_client(al, CmtimeOptions(server=args.server_ip, port=args.port, connections=10),
                   out=lambda _s: None)  # fmt: skip  (warm: imports, first objects)
        if args.count_calls:
            print(f"{REPO}: {count_calls(al, opts, args.runs):.0f} calls per connection "
                  "(client, every thread, builtins included)")  # fmt: skip
            return
        server_cpu0 = cpu_ms(server.pid)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        connects = []
        for _ in range(args.runs):
            connects.append(run_client(al, opts, out=lambda _s: None).total["connect"])
        cpu = (time.process_time() - cpu0) / args.runs
        wall = (time.perf_counter() - wall0) / args.runs
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        switches = (ru1.ru_nvcsw - ru0.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nivcsw) / args.runs
        server_cpu = cpu_ms(server.pid) - server_cpu0
        al.close()
    finally:
        mgr.close()
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    print(f"{REPO}: {args.runs} runs x {args.connections} connections: client CPU/run "
          f"{cpu * 1e3:.1f} ms, context switches/run {switches:.0f}, connect median "
          f"{statistics.median(connects) * 1e3:.1f} ms, wall/run {wall * 1e3:.1f} ms, "
          f"server CPU/run {server_cpu / args.runs:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
