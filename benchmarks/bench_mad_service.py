"""The MAD service's own cost per MAD: elements (``send``/``recv_cb``) vs bytes (datagrams).

Two MAD services of the CM's class (0x07 v2, unsolicited Sends) on two ports
of the mock fabric: one sends ``--mads`` MADs to the other, which counts them
as they arrive.  Two shapes of the same traffic (each on its own two ports):

* ``elements``: a MAD element from the pool per send, ``MadService.send``,
  ``send_cb`` gives it back; the receiver gets an element in ``recv_cb`` and
  gives it back (``put_mad``), callbacks on the misc queue: what the CM did
  before issue 22;
* ``datagrams``: ``inline`` services, ``MadService.send_datagram`` (bytes, no
  element, no ``send_cb``) and ``datagram_cb`` (bytes) on the receiver: the
  CM's path now.

Printed per MAD: the CPU time (this process, every thread) and, with
``--count-calls`` (``pip install yappi``), the function calls, builtins
included: deterministic where CPU figures move by 10 % between runs::

    python benchmarks/bench_mad_service.py [--mads 4000] [--rounds 5] [--count-calls]

``--rxe IP,IP`` runs the ``datagrams`` shape over two userspace rxe devices
on those (loopback) addresses instead of the mock: the CM's per-MAD path down
to the wire (QP1's send ring, rxe's UD requester, ``sendmmsg``; root).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ibal  # noqa: E402
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc  # noqa: E402
from ibal.types import Grh, LinkLayer, MadAddr, PortAttr, QpType  # noqa: E402
from ibal.wire.mad import header as mad_header  # noqa: E402
from ibal.wire.mad.cm import CM_CLASS, CM_CLASS_VERSION  # noqa: E402
from ibal.wire.mad.consts import CmAttr, Method  # noqa: E402


class Pair:
    """A sending and a receiving service on two mock ports, and the receiver's count."""

    def __init__(self, al: ibal.AccessLayer, datagrams: bool, first: int) -> None:
        cas = [al.open_ca(g) for g in al.get_ca_guids()[first : first + 2]]
        ports = [ca.query().ports[0] for ca in cas]
        self.got = 0
        self.want = 0
        self.done = threading.Event()
        self.sent_back = 0
        svcs: list[MadService] = []
        for i, (ca, port) in enumerate(zip(cas, ports, strict=True)):
            alias = ca.alloc_pd().get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
            svc = MadSvc(CM_CLASS, CM_CLASS_VERSION, self._recv, self._sent,
                         methods=frozenset({Method.SEND}), support_unsol=True)  # fmt: skip
            svcs.append(reg_mad_svc(alias, svc, inline=datagrams,
                                    datagram_cb=self._datagram if datagrams and i else None))
        self.tx = svcs[0]
        self.addr = MadAddr(remote_qp=1, dlid=ports[1].lid)
        if ports[1].link_layer is not LinkLayer.INFINIBAND:  # RoCE: by GID (IPv4-mapped)
            def v4(pa: PortAttr) -> int:
                return next(i for i, g in enumerate(pa.gids) if g.packed[10:12] == b"\xff\xff")

            self.addr = MadAddr(remote_qp=1, grh=Grh(dgid=ports[1].gids[v4(ports[1])],
                                                     sgid_index=v4(ports[0]), hop_limit=64))
        self.mad = bytes(mad_header.build(CM_CLASS, Method.SEND, CmAttr.DREP, tid=1))

    def _count(self) -> None:
        self.got += 1
        if self.got == self.want:
            self.done.set()

    def _recv(self, e: MadElement) -> None:
        put_mad(e)
        self._count()

    def _datagram(self, _mad: bytes, _addr: MadAddr) -> None:
        self._count()

    def _sent(self, e: MadElement) -> None:
        put_mad(e)

    def run(self, n: int, datagrams: bool) -> None:
        self.got, self.want = 0, n
        self.done.clear()
        for _ in range(n):
            if datagrams:
                self.tx.send_datagram(self.mad, self.addr)
            else:
                e = self.tx.pool_key.get_mad()
                e.mad[:] = self.mad
                e.addr = self.addr
                e.resp_expected, e.timeout_ms, e.retry_cnt = False, 0, 0
                self.tx.send(e)
        if not self.done.wait(60):
            raise SystemExit(f"only {self.got} of {n} MADs arrived")


def measure(pair: Pair, n: int, datagrams: bool, count: bool) -> float:
    """CPU µs (or calls, with ``count``) per MAD for one run of ``n`` MADs."""
    if count:
        import yappi  # type: ignore[import-untyped]

        yappi.clear_stats()
        yappi.start(builtins=True)
        pair.run(n, datagrams)
        yappi.stop()
        return float(sum(s.ncall for s in yappi.get_func_stats())) / n
    cpu0 = time.process_time()
    pair.run(n, datagrams)
    return (time.process_time() - cpu0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mads", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count-calls", action="store_true")
    ap.add_argument("--rxe", metavar="IP,IP", help="datagrams over two userspace rxe devices")
    args = ap.parse_args()
    if args.rxe:
        a, b = args.rxe.split(",")
        providers: dict[str, dict[str, object]] = {"rxe": {"devices": f"rxe_ma={a},rxe_mb={b}"}}
    else:
        providers = {"mock": {"cas": 4}}
    with ibal.open_al(providers) as al:
        pairs: dict[str, tuple[Pair, bool]] = (
            {"datagrams": (Pair(al, True, 0), True)} if args.rxe else {
                "elements": (Pair(al, False, 0), False),
                "datagrams": (Pair(al, True, 2), True),
            })  # fmt: skip
        figures: dict[str, list[float]] = {k: [] for k in pairs}
        for pair, dg in pairs.values():
            pair.run(100, dg)  # warm
        rounds = 1 if args.count_calls else args.rounds
        for _ in range(rounds):  # alternated, so the machine's load hits both alike
            for name, (pair, dg) in pairs.items():
                figures[name].append(measure(pair, args.mads, dg, args.count_calls))
        unit = "calls" if args.count_calls else "CPU us"
        show: Callable[[list[float]], str] = lambda xs: (  # noqa: E731
            f"median {statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f})")
        for name, xs in figures.items():
            print(f"{name:10s} {unit} per MAD (send + receive, both services): {show(xs)}")


if __name__ == "__main__":
    main()
