"""ibal perftest vs kernel rxe's own perftest tools, in a 2-CPU lab guest.

Three figures, each measured with perftest's tools on kernel rxe and with
``ibal perftest`` on an ibal provider, both ends in the guest:

* RDMA WRITE bandwidth at 64 KiB (``ib_write_bw -s 65536``: BW average, MB/s),
* 8-byte message rate (``ib_write_bw -s 8``: MsgRate, Mpps),
* 8-byte send latency (``ib_send_lat -s 8``: t_typical, µs),

and the ratios ibal / kernel (bandwidth and message rate: higher is better;
latency: lower is better, target within 3x).  With ``--provider rxe`` (the
default) the ibal side is the userspace rxe engine: it binds UDP 4791 itself,
so in each round kernel rxe is measured first, then removed (``rdma link
delete rxe0; rmmod rdma_rxe``) and ibal's two ends run as two devices on
``lo`` (server ``127.0.0.2``, client ``127.0.0.3``, GID index 0: an
address-bound device's GID table starts with its IPv4-mapped GID); the next
round loads kernel rxe again.  With ``--provider rdma_core`` the ibal side is
Python + the access layer on top of the same kernel rxe.

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
    return Path("/sys/class/infiniband", device).exists() or "IBAL_BENCH_GUEST" in os.environ


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


def measure(
    kind: str, argv_for: dict[str, tuple[list[str], list[str]]], test: str, size: int, iters: int
) -> float:
    """One figure: BW average (MB/s) for bw_64k, MsgRate (Mpps) for rate_8, t_typical (µs)."""
    args = ["-s", str(size), "-n", str(iters), "-F"]
    server, client = argv_for[test]
    _, out = run_pair([*server, *args], [*client, *args, "127.0.0.1"])
    row = table_row(out)
    if kind == "bw":
        return float(row[3])
    if kind == "rate":
        return float(row[4])
    return float(row[4])  # t_typical


def kernel_rxe(present: bool, device: str) -> None:
    """Load (``modprobe rdma_rxe`` + ``rdma link add DEVICE type rxe netdev lo``) or
    remove kernel rxe: it binds UDP 4791 on every address, ibal's rxe cannot share it."""
    here = Path("/sys/class/infiniband", device).exists()
    if present and not here:
        subprocess.run(["modprobe", "rdma_rxe"], check=True)
        subprocess.run(["rdma", "link", "add", device, "type", "rxe", "netdev", "lo"], check=True)
    elif not present and here:
        subprocess.run(["rdma", "link", "delete", device], check=True)
        subprocess.run(["rmmod", "rdma_rxe"], check=True)


def _env_wrap(env: dict[str, str], argv: list[str]) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv]


def guest_main(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    gid = ["-d", args.device, "-x", str(args.gid_index)]
    kernel = {
        "write_bw": (["ib_write_bw", *gid], ["ib_write_bw", *gid]),
        "send_lat": (["ib_send_lat", *gid], ["ib_send_lat", *gid]),
    }
    py = [sys.executable, "-m", "ibal.cli", "perftest"]
    userspace = args.provider == "rxe"
    prov = ["--provider", args.provider]
    ours_gid = ["-d", args.device, "-x", "0" if userspace else str(args.gid_index)]

    def side(test: str, *extra: str) -> tuple[list[str], list[str]]:
        argv = [*py, test, *prov, *ours_gid, *extra]
        if not userspace:
            return argv, argv
        # two address-bound devices on lo, one per process
        return (
            _env_wrap({"IBAL_RXE_DEVICES": f"{args.device}=127.0.0.2"}, argv),
            _env_wrap({"IBAL_RXE_DEVICES": f"{args.device}=127.0.0.3"}, argv),
        )

    ours = {"write_bw": side("write_bw"), "send_lat": side("send_lat", *args.lat_args.split())}
    figures = {
        "bw_64k_MBps": ("bw", "write_bw", 65536, args.bw_iters),
        "rate_8B_Mpps": ("rate", "write_bw", 8, args.rate_iters),
        "lat_8B_usec": ("lat", "send_lat", 8, args.lat_iters),
    }
    if args.only:
        figures = {k: v for k, v in figures.items() if k in args.only}
    results: dict[str, dict[str, list[float]]] = {"kernel": {}, "ibal": {}}
    for _ in range(args.rounds):
        # userspace rxe: every kernel figure of the round first, then every ibal one
        order = (
            [("kernel", kernel, n) for n in figures] + [("ibal", ours, n) for n in figures]
            if userspace
            else [(s, a, n) for n in figures for s, a in (("kernel", kernel), ("ibal", ours))]
        )
        for who, argv, name in order:
            if userspace:
                kernel_rxe(who == "kernel", args.device)
            kind, test, size, iters = figures[name]
            value = measure(kind, argv, test, size, iters)
            results[who].setdefault(name, []).append(value)
            print(f"# {who:6} {name:14} {value}", file=sys.stderr, flush=True)
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
    ap.add_argument("--provider", default="rxe", help="ibal provider for ibal perftest")
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
    env = dict(
        os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}", IBAL_BENCH_GUEST="1"
    )
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
