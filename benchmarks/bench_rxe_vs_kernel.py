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

``--two-guests`` is issue 21's comparison (b): two guests on one lab link
(``Lab.cluster(2)``, 10.98.0.1 sends, 10.98.0.2 serves, MTU 9000), so every
packet crosses both guests' IP/UDP stacks.  Per round: kernel rxe on each end
(perftest's tools); ``ibal perftest --provider rxe`` on each end
(``IBAL_RXE_DEVICES=rxe0=<link address>``, GID index 0) once per engine in
``--engines``; then ibal's rxe against kernel rxe each way (the kernel end runs
``ibal perftest --provider rdma_core -x 1`` on ``rxe0``, since ``ibal perftest``
talks only to itself): ibal sending to kernel, kernel sending to ibal.  With
``--loopback`` the first guest then runs (a) in the same boot (``rxe0`` moved
to ``lo``).  Same ``-s -n -F`` everywhere; post-list depth 1 and CQ moderation
100 on both tools (perftest's defaults: ``ibal perftest`` has no ``-l``).
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
from typing import Any

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


# -- (b): two guests on one link -----------------------------------------------------------

FIGURES = {
    "bw_64k_MBps": ("bw", "write_bw", 65536),
    "rate_8B_Mpps": ("rate", "write_bw", 8),
    "lat_8B_usec": ("lat", "send_lat", 8),
}


def _value(kind: str, output: str) -> float:
    row = table_row(output)
    return float(row[3]) if kind == "bw" else float(row[4])


class Pair:
    """The two guests of (b): guest 0 is the client (sender), guest 1 the server."""

    def __init__(self, cluster: Any, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.kernel_on = [True, True]  # the agent put kernel rxe0 on each link NIC

    def set_kernel(self, index: int, present: bool) -> None:
        """Kernel rxe on guest `index`'s link NIC, or not (it holds UDP 4791 on every address)."""
        if self.kernel_on[index] == present:
            return
        s = self.cluster[index]
        dev = self.args.device
        cmd = (
            f"modprobe rdma_rxe && rdma link add {dev} type rxe netdev "
            f"$(ip -o -4 addr show to {s.link.ip} | awk '{{print $2}}')"
            if present
            else f"rdma link delete {dev} && rmmod rdma_rxe"
        )
        s.run(cmd, timeout=120).check_returncode()
        self.kernel_on[index] = present

    def argv(self, index: int, who: str, test: str, size: int, iters: int) -> tuple[
        list[str], dict[str, str]
    ]:
        """Guest `index`'s command for end type `who`: kernel, ibal-rdma_core, ibal-ENGINE."""
        a = self.args
        common = ["-s", str(size), "-n", str(iters), "-F"]
        env = self.cluster.env_for(index, dict(os.environ, PYTHONPATH=str(REPO)))
        env["PYTHONUNBUFFERED"] = "1"  # the server's banner must reach its file at once
        if who == "kernel":
            argv = ["stdbuf", "-oL", f"ib_{test}", "-d", a.device, "-x", str(a.gid_index), *common]
        else:
            py = [sys.executable, "-m", "ibal.cli", "perftest", test, "-d", a.device, *common]
            if test == "send_lat":
                py += a.lat_args.split()
            if who == "ibal-rdma_core":
                argv = [*py, "--provider", "rdma_core", "-x", str(a.gid_index)]
            else:
                argv = [*py, "--provider", "rxe", "-x", "0"]
                env["IBAL_RXE_DEVICES"] = f"{a.device}={self.cluster[index].link.ip}"
                env["IBAL_RXE_ENGINE"] = who.split("-", 1)[1]
        if index == 0:
            argv.append(self.cluster[1].link.ip)
        return argv, env

    def measure(self, client: str, server: str, name: str, iters: int) -> float:
        """One figure with `client` on guest 0 and `server` on guest 1."""
        kind, test, size = FIGURES[name]
        self.set_kernel(0, client == "kernel" or client == "ibal-rdma_core")
        self.set_kernel(1, server == "kernel" or server == "ibal-rdma_core")
        s_argv, s_env = self.argv(1, server, test, size, iters)
        c_argv, c_env = self.argv(0, client, test, size, iters)
        a, b = self.cluster
        srv = b.guest_start(s_argv, env=s_env, cwd=str(REPO), timeout=self.args.fig_timeout)
        try:
            deadline = time.monotonic() + self.args.fig_timeout
            # Both tools print this just before they listen (line-buffered, see argv):
            # starting the client earlier costs a whole interpreter start per refused
            # try in a starved guest.  Bounded; the retries below still cover a miss.
            seen = b""
            banner_by = time.monotonic() + 120
            while b"Waiting for client" not in seen and not srv.done():
                if time.monotonic() > banner_by:
                    break
                seen += srv.read_new("stdout")
                time.sleep(0.2)
            while True:
                cli = a.run(c_argv, env=c_env, cwd=str(REPO), timeout=self.args.fig_timeout)
                if cli.returncode == 0 or srv.done() or time.monotonic() > deadline:
                    break
                if "connect" not in (cli.stdout_text + cli.stderr_text).lower():
                    break
                time.sleep(0.2)  # the server is still starting
            s_res = srv.wait(timeout=60 if cli.returncode == 0 else 5)
        except TimeoutError:
            s_res = None
        finally:
            if not srv.done():
                srv.kill()
        if cli.returncode != 0:
            raise RuntimeError(
                f"{' '.join(c_argv)} failed ({cli.returncode}):\n{cli.stdout_text}{cli.stderr_text}"
                f"\nserver:\n{s_res.stdout_text + s_res.stderr_text if s_res else '(running)'}"
            )
        return _value(kind, cli.stdout_text)


def two_guests_main(args: argparse.Namespace) -> int:
    """(b) from the host: boot the pair, measure every pairing, optionally (a) in guest 0."""
    sys.path.insert(0, str(REPO))  # this checkout's ibal, as the guests get through PYTHONPATH
    from ibal.lab import Lab, LinkConfig

    engines = [e for e in args.engines.split(",") if e]
    pairings = [("kernel", "kernel", "kernel rxe <-> kernel rxe")]
    pairings += [(f"ibal-{e}", f"ibal-{e}", f"ibal rxe ({e}) <-> ibal rxe ({e})") for e in engines]
    mixed = f"ibal-{engines[-1]}"
    if not args.no_mixed:
        pairings += [
            (mixed, "ibal-rdma_core", f"ibal rxe ({engines[-1]}) -> kernel rxe"),
            ("ibal-rdma_core", mixed, f"kernel rxe -> ibal rxe ({engines[-1]})"),
        ]
    iters = {"bw_64k_MBps": args.bw_iters, "rate_8B_Mpps": args.rate_iters,
             "lat_8B_usec": args.lat_iters}  # fmt: skip
    names = [n for n in FIGURES if not args.only or n in args.only]
    results: dict[str, dict[str, list[float]]] = {label: {} for _, _, label in pairings}
    failed: dict[str, dict[str, str]] = {}
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# host load average at start: {' '.join(loadavg)}", file=sys.stderr, flush=True)
    lab = Lab(cpus=args.cpus)
    with lab.cluster(2, link=LinkConfig(mtu=args.link_mtu)) as cluster:
        print(f"# two guests booted in {cluster.boot_seconds:.1f} s", file=sys.stderr, flush=True)
        pair = Pair(cluster, args)
        for _ in range(args.rounds):
            for client, server, label in pairings:
                for name in names:
                    try:
                        value = pair.measure(client, server, name, iters[name])
                    except RuntimeError as exc:  # recorded, and the other pairings still run
                        failed.setdefault(label, {})[name] = str(exc)
                        print(f"# {label:34} {name:14} FAILED: {exc}", file=sys.stderr, flush=True)
                        continue
                    results[label].setdefault(name, []).append(value)
                    print(f"# {label:34} {name:14} {value}", file=sys.stderr, flush=True)
        loop_out = ""
        if args.loopback:
            pair.set_kernel(0, False)  # (a) loads kernel rxe on lo itself
            a = cluster[0]
            argv = [sys.executable, str(Path(__file__).resolve()), "--provider", "rxe",
                    "--rounds", str(args.rounds), "--bw-iters", str(args.bw_iters),
                    "--rate-iters", str(args.rate_iters), "--lat-iters", str(args.lat_iters),
                    *(f"--only={n}" for n in args.only or ()), "--json"]  # fmt: skip
            env = dict(os.environ, PYTHONPATH=str(REPO), IBAL_BENCH_GUEST="1")
            r = a.run(argv, env=env, cwd=str(REPO), timeout=3000,
                      on_stderr=lambda b: sys.stderr.buffer.write(b))  # fmt: skip
            r.check_returncode()
            loop_out = r.stdout_text
    loadavg_end = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# host load average at end: {' '.join(loadavg_end)}", file=sys.stderr, flush=True)
    med = {lb: {n: statistics.median(v) for n, v in figs.items()} for lb, figs in results.items()}
    base = med["kernel rxe <-> kernel rxe"]
    print(f"(b) two guests, {args.cpus} vCPU each, link MTU {args.link_mtu}, "
          f"{args.rounds} round(s), median; ratio = / kernel rxe <-> kernel rxe")  # fmt: skip
    print(f"{'pairing':34} " + " ".join(f"{n:>14} {'ratio':>6}" for n in names))
    for label, figs in med.items():
        cells = []
        for n in names:
            if n not in figs:
                cells.append(f"{'failed':>14} {'':6}")
                continue
            ratio = figs[n] / base[n] if base.get(n) else float("nan")
            cells.append(f"{figs[n]:14.6g} {ratio:6.3f}")
        print(f"{label:34} " + " ".join(cells))
    for label, figs_failed in failed.items():
        for n, why in figs_failed.items():
            last = [ln for ln in why.splitlines() if "rror" in ln][:1]
            print(f"failed: {label}, {n}: {last[0] if last else why.splitlines()[0]}")
    if loop_out:
        print("\n(a) loopback in guest 0, same boot")
        print(loop_out, end="")
    if args.json:
        print(json.dumps({"two_guests": med, "failed": failed, "load_start": loadavg,
                          "load_end": loadavg_end}))
    return 0


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
    ap.add_argument("--two-guests", action="store_true",
                    help="comparison (b): two guests on one lab link (from the host)")
    ap.add_argument("--engines", default="python,c",
                    help="(b) ibal rxe engines, comma-separated; the last runs the mixed pairs")
    ap.add_argument("--loopback", action="store_true", help="(b) then (a) in guest 0, same boot")
    ap.add_argument("--no-mixed", action="store_true", help="(b) without ibal against kernel")
    ap.add_argument("--link-mtu", type=int, default=9000, help="(b) link MTU")
    ap.add_argument("--fig-timeout", type=float, default=600, help="(b) seconds per figure")
    args = ap.parse_args()
    if args.two_guests:
        sys.exit(two_guests_main(args))
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
