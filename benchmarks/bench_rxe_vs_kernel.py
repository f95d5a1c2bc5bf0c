"""ibal perftest vs kernel rxe's own perftest tools, in a 2-CPU lab guest.

Three figures, each measured with perftest's tools on kernel rxe and with
``ibal perftest`` on an ibal provider, both ends in the guest:

* RDMA WRITE bandwidth at 64 KiB (``ib_write_bw -s 65536``: BW average, MB/s),
* 8-byte message rate (``ib_write_bw -s 8``: MsgRate, Mpps),
* 8-byte send latency (``ib_send_lat -s 8``: t_typical, µs),

and the ratios ibal / kernel (bandwidth and message rate: higher is better;
latency: lower is better, target within 3x).  Today the ibal side is the
``rdma_core`` provider over the same kernel rxe (so the ratio is the cost of
Python + the access layer on top of kernel rxe); with ``--provider rxe`` it is
the userspace rxe engine (which binds UDP 4791 itself, so it needs a guest
without kernel rxe: see docs/performance.md).

Run from the host (boots the guest itself)::

    python benchmarks/bench_rxe_vs_kernel.py [--cpus 2] [--rounds 1]

or inside a guest: ``ibal lab run --cpus 2 -- python benchmarks/bench_rxe_vs_kernel.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def in_guest(device: str) -> bool:
    return Path("/sys/class/infiniband", device).exists()


def run_pair(server: list[str], client: list[str], timeout: float = 300) -> tuple[str, str]:
    """Start the server, retry the client until the server listens; both outputs."""
    srv = subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    cli = None
    while time.monotonic() < deadline:
        cli = subprocess.run(client, capture_output=True, text=True, timeout=timeout)
        if cli.returncode == 0 or srv.poll() is not None:
            break
        if "connect" not in (cli.stdout + cli.stderr).lower():
            break
        time.sleep(0.1)  # the server is still starting
    try:
        s_out, _ = srv.communicate(timeout=30 if cli and cli.returncode == 0 else 5)
    except subprocess.TimeoutExpired:
        srv.kill()
        s_out, _ = srv.communicate()
    if cli is None or cli.returncode != 0:
        raise RuntimeError(
            f"{' '.join(client)} failed:\n{cli.stdout if cli else ''}{cli.stderr if cli else ''}"
            f"\nserver:\n{s_out}"
        )
    return s_out, cli.stdout


def table_row(output: str) -> list[str]:
    """The fields of the line after perftest's ``#bytes`` header."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes") and i + 1 < len(lines):
            return lines[i + 1].split()
    raise RuntimeError(f"no result table in:\n{output}")


def measure(kind: str, argv_for: dict[str, list[str]], test: str, size: int, iters: int) -> float:
    """One figure: BW average (MB/s) for bw_64k, MsgRate (Mpps) for rate_8, t_typical (µs)."""
    args = ["-s", str(size), "-n", str(iters), "-F"]
    base = argv_for[test]
    _, out = run_pair([*base, *args], [*base, *args, "127.0.0.1"])
    row = table_row(out)
    if kind == "bw":
        return float(row[3])
    if kind == "rate":
        return float(row[4])
    return float(row[4])  # t_typical


def guest_main(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    gid = ["-d", args.device, "-x", str(args.gid_index)]
    kernel = {
        "write_bw": ["ib_write_bw", *gid],
        "send_lat": ["ib_send_lat", *gid],
    }
    py = [sys.executable, "-m", "ibal.cli", "perftest"]
    prov = ["--provider", args.provider]
    ours = {
        "write_bw": [*py, "write_bw", *prov, *gid],
        "send_lat": [*py, "send_lat", *prov, *gid, *args.lat_args.split()],
    }
    figures = {
        "bw_64k_MBps": ("bw", "write_bw", 65536, args.bw_iters),
        "rate_8B_Mpps": ("rate", "write_bw", 8, args.rate_iters),
        "lat_8B_usec": ("lat", "send_lat", 8, args.lat_iters),
    }
    if args.only:
        figures = {k: v for k, v in figures.items() if k in args.only}
    results: dict[str, dict[str, list[float]]] = {"kernel": {}, "ibal": {}}
    for _ in range(args.rounds):
        for name, (kind, test, size, iters) in figures.items():
            for side, argv in (("kernel", kernel), ("ibal", ours)):
                value = measure(kind, argv, test, size, iters)
                results[side].setdefault(name, []).append(value)
                print(f"# {side:6} {name:14} {value}", file=sys.stderr, flush=True)
    return {
        side: {k: statistics.median(v) for k, v in figs.items()} for side, figs in results.items()
    }


def report(res: dict[str, dict[str, float]], provider: str) -> None:
    print(f"{'figure':16} {'kernel rxe':>12} {'ibal ' + provider:>16} {'ratio':>8}")
    for name, theirs in res["kernel"].items():
        ours = res["ibal"][name]
        # Ratios read "ibal relative to kernel": above 1 is better for bandwidth and rate;
        # for latency it is how many times kernel rxe's latency ibal takes.
        ratio = ours / theirs if theirs else float("nan")
        print(f"{name:16} {theirs:12.4f} {ours:16.4f} {ratio:8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", default="rdma_core", help="ibal provider for ibal perftest")
    ap.add_argument("--device", default="rxe0")
    ap.add_argument("--gid-index", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--bw-iters", type=int, default=2000)
    ap.add_argument("--rate-iters", type=int, default=20000)
    ap.add_argument("--lat-iters", type=int, default=1000)
    ap.add_argument("--cpus", type=int, default=2, help="guest CPUs (from the host)")
    ap.add_argument("--only", action="append", help="only this figure (repeatable)")
    ap.add_argument("--lat-args", default="", help="extra ibal perftest options for send_lat")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = ap.parse_args()
    if in_guest(args.device):
        res = guest_main(args)
        report(res, args.provider)
        if args.json:
            print(json.dumps(res))
        return
    from ibal.lab import Lab

    argv = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    r = Lab(cpus=args.cpus).run(
        argv,
        timeout=3000,
        env=env,
        cwd=str(REPO),
        on_stderr=lambda b: sys.stderr.buffer.write(b),
    )
    sys.stdout.write(r.stdout_text)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
