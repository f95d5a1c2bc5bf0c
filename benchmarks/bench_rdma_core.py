"""RDMA WRITE message rate on one rdma-core device: ibal (AL + rdma_core) vs plain pyverbs.

One process, one device (``rxe0`` in the lab), one run: two RC QPs connected
to each other on port 1, 8-byte RDMA WRITEs, every one signaled, ``--window``
of them in flight, completions polled ``--batch`` at a time.  Each side keeps
its work requests built once and re-posts them, as a tuned program would.

Sides, measured in turns (``--rounds``) so that drift hits all of them:

* ``ibal``: ``qp.post_send(list)`` / ``cq.poll(batch)`` of the access layer
  over the ``rdma_core`` provider, on its default data path (libibverbs'
  dispatch table through ctypes; see docs/rdma-core-provider.md);
* ``ibal-pyverbs``: the same with ``IBAL_RDMA_CORE_DATAPATH=pyverbs`` (the
  provider posts and polls through pyverbs objects);
* ``pyverbs-chain``: pyverbs ``SendWR`` objects chained once; the free slots
  are posted with one ``QP.post_send`` (one ibv_post_send, one doorbell);
* ``pyverbs-each``: one ``QP.post_send`` per work request, the way pyverbs'
  own examples post.

Run it in the lab guest::

    ibal lab run -- python benchmarks/bench_rdma_core.py

It prints messages/s for each side (median of the rounds) and the ratios
ibal / pyverbs (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

WINDOW = 64
BATCH = 64
SIZE = 8


def gid_index_v4(ctx: Any, port: int) -> int:
    """The IPv4-mapped RoCE v2 GID of the port (loopback works on any netdev with it)."""
    for e in ctx.query_gid_table(1024):
        if e.port_num == port and e.gid_str().startswith("0000:0000:0000:0000:0000:ffff:"):
            return int(e.gid_index)
    return 0


# ---------------------------------------------------------------- plain pyverbs


class PyverbsSide:
    def __init__(self, device: str, window: int) -> None:
        from ibal.providers.rdma_core import loader

        loader.load()
        import pyverbs.enums as e
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.wr import SGE, SendWR

        self.e = e
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 2 * window + 16, None, None, 0)
        cap = QPCap(max_send_wr=window, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qps = [
            QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
            for _ in range(2)
        ]
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.src = MR(self.pd, 4096, access)
        self.dst = MR(self.pd, 4096, access)
        gidx = gid_index_v4(self.ctx, 1)
        gid = self.ctx.query_gid(1, gidx)
        for qp, peer in ((self.qps[0], self.qps[1]), (self.qps[1], self.qps[0])):
            a = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
            a.port_num = 1
            a.pkey_index = 0
            a.qp_access_flags = access
            qp.to_init(a)
            a.ah_attr = AHAttr(
                gr=GlobalRoute(dgid=gid, sgid_index=gidx, hop_limit=64), is_global=1, port_num=1
            )
            a.path_mtu = e.IBV_MTU_1024
            a.dest_qp_num = peer.qp_num
            a.rq_psn = 0
            a.max_dest_rd_atomic = 1
            a.min_rnr_timer = 12
            qp.to_rtr(a)
            a.sq_psn = 0
            a.timeout = 14
            a.retry_cnt = 7
            a.rnr_retry = 7
            a.max_rd_atomic = 1
            qp.to_rts(a)
        self.sges = [SGE(self.src.buf, SIZE, self.src.lkey) for _ in range(window)]
        self.wrs = []
        for i in range(window):
            wr = SendWR(
                wr_id=i,
                opcode=e.IBV_WR_RDMA_WRITE,
                num_sge=1,
                sg=[self.sges[i]],
                send_flags=e.IBV_SEND_SIGNALED,
            )
            wr.set_wr_rdma(self.dst.rkey, self.dst.buf + 8 * (i % 64))
            self.wrs.append(wr)
        # The chained variant: a second set linked wrs[i] -> wrs[i+1]; posting
        # the last k of them sends k work requests with one call.
        self.chain = []
        for i in range(window):
            wr = SendWR(
                wr_id=i,
                opcode=e.IBV_WR_RDMA_WRITE,
                num_sge=1,
                sg=[self.sges[i]],
                send_flags=e.IBV_SEND_SIGNALED,
            )
            wr.set_wr_rdma(self.dst.rkey, self.dst.buf + 8 * (i % 64))
            self.chain.append(wr)
        for a_, b_ in zip(self.chain, self.chain[1:], strict=False):
            a_.next_wr = b_

    def run_each(self, messages: int, window: int, batch: int) -> float:
        qp = self.qps[0]
        post = qp.post_send
        poll = self.cq.poll
        wrs = self.wrs
        inflight = posted = done = 0
        t0 = time.perf_counter()
        while done < messages:
            while inflight < window and posted < messages:
                post(wrs[posted % window])
                posted += 1
                inflight += 1
            n, wcs = poll(batch)
            if n:
                for w in wcs:
                    if w.status:
                        raise SystemExit(f"pyverbs: completion status {w.status}")
                done += n
                inflight -= n
        return messages / (time.perf_counter() - t0)

    def run_chain(self, messages: int, window: int, batch: int) -> float:
        qp = self.qps[0]
        post = qp.post_send
        poll = self.cq.poll
        chain = self.chain
        inflight = posted = done = 0
        t0 = time.perf_counter()
        while done < messages:
            k = min(window - inflight, messages - posted)
            if k > 0:
                post(chain[window - k])
                posted += k
                inflight += k
            n, wcs = poll(batch)
            if n:
                for w in wcs:
                    if w.status:
                        raise SystemExit(f"pyverbs: completion status {w.status}")
                done += n
                inflight -= n
        return messages / (time.perf_counter() - t0)

    def close(self) -> None:
        for s in self.sges:
            s.close()
        for w in (*self.wrs, *self.chain):
            w.close()
        self.ctx.close()


# ------------------------------------------------------------------------- ibal


class IbalSide:
    def __init__(self, device: str, window: int, datapath: str = "auto") -> None:
        from ibal.al import AlManager, QpCreate
        from ibal.providers.rdma_core.fastpath import DATAPATH_ENV
        from ibal.types import (
            AccessFlags,
            AvAttr,
            Grh,
            Mtu,
            QpMod,
            QpState,
            QpType,
            SendOpt,
            SendWr,
            WrType,
        )

        self.mgr = AlManager()
        saved = os.environ.get(DATAPATH_ENV)
        os.environ[DATAPATH_ENV] = datapath
        try:
            provider = self.mgr.start_provider("rdma_core", {"devices": [device]})
        finally:
            if saved is None:
                del os.environ[DATAPATH_ENV]
            else:
                os.environ[DATAPATH_ENV] = saved
        if provider.unavailable_reason:
            raise SystemExit(f"rdma_core: {provider.unavailable_reason}")
        self.datapath = provider.cas[0].datapath  # type: ignore[attr-defined]
        self.al = self.mgr.open_al()
        self.ca = self.al.open_ca(self.al.get_ca_guids()[0])
        port = self.ca.query().ports[0]
        self.pd = self.ca.alloc_pd()
        self.cq = self.ca.create_cq(2 * window + 16)
        self.qps = [
            self.pd.create_qp(QpCreate(QpType.RC, self.cq, self.cq, sq_depth=window, rq_depth=1))
            for _ in range(2)
        ]
        access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE
        self.src_buf = bytearray(4096)
        self.dst_buf = bytearray(4096)
        self.src = self.pd.reg_mem(self.src_buf, access)
        self.dst = self.pd.reg_mem(self.dst_buf, access)
        av = AvAttr(port.port_num, grh=Grh(port.gids[0]) if port.gids else None)
        for qp, peer in ((self.qps[0], self.qps[1]), (self.qps[1], self.qps[0])):
            qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=port.port_num, access=access))
            qp.modify(
                QpMod(
                    QpState.RTR, primary_av=av, path_mtu=Mtu.MTU_1024, dest_qp=peer.num,
                    rq_psn=0, resp_res=1, rnr_nak_timeout=12,
                )
            )  # fmt: skip
            qp.modify(
                QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                      rnr_retry_cnt=7, init_depth=1)
            )  # fmt: skip
        self.wrs = [
            SendWr(
                wr_id=i,
                opcode=WrType.RDMA_WRITE,
                sg_list=[self.src.sge(0, SIZE)],
                send_opt=SendOpt.SIGNALED,
                remote_addr=self.dst.vaddr + 8 * (i % 64),
                rkey=self.dst.rkey,
            )
            for i in range(window)
        ]

    def run(self, messages: int, window: int, batch: int) -> float:
        from ibal.types import WcStatus

        post = self.qps[0].post_send
        poll = self.cq.poll
        wrs = self.wrs
        ok = WcStatus.SUCCESS
        inflight = posted = done = 0
        t0 = time.perf_counter()
        while done < messages:
            k = min(window - inflight, messages - posted)
            if k > 0:
                post(wrs[:k])
                posted += k
                inflight += k
            wcs = poll(batch)
            if wcs:
                for w in wcs:
                    if w.status is not ok:
                        raise SystemExit(f"ibal: completion status {w.status.name}")
                n = len(wcs)
                done += n
                inflight -= n
        return messages / (time.perf_counter() - t0)

    def close(self) -> None:
        self.al.close()
        self.mgr.close()


# ------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="rxe0")
    ap.add_argument("--messages", type=int, default=5000, help="per side and round")
    ap.add_argument("--window", type=int, default=WINDOW, help="RDMA WRITEs in flight")
    ap.add_argument("--batch", type=int, default=BATCH, help="completions per poll")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", action="store_true", help="print one JSON line as well")
    args = ap.parse_args(argv)

    pv = PyverbsSide(args.device, args.window)
    ib = IbalSide(args.device, args.window)
    ibp = IbalSide(args.device, args.window, "pyverbs")
    sides: dict[str, Callable[[int, int, int], float]] = {
        "pyverbs-each": pv.run_each,
        "pyverbs-chain": pv.run_chain,
        "ibal": ib.run,
        "ibal-pyverbs": ibp.run,
    }
    warm = max(1000, args.messages // 5)
    for fn in sides.values():
        fn(warm, args.window, args.batch)
    results: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, fn in sides.items():
            results[name].append(fn(args.messages, args.window, args.batch))
    datapath = ib.datapath
    ib.close()
    ibp.close()
    pv.close()

    med = {name: statistics.median(v) for name, v in results.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(results[a], results[b], strict=True))

    print(
        f"RDMA WRITE {SIZE} B on {args.device}: window {args.window}, poll batch {args.batch}, "
        f"{args.messages} messages x {args.rounds} rounds per side; ibal data path: {datapath}"
    )
    for name, v in results.items():
        spread = ", ".join(f"{x / 1000:.1f}" for x in v)
        print(f"  {name:<14} {med[name] / 1000:8.1f} k msg/s   (rounds: {spread})")
    ratios = {
        "ibal / pyverbs-chain": ratio("ibal", "pyverbs-chain"),
        "ibal / pyverbs-each": ratio("ibal", "pyverbs-each"),
        "ibal-pyverbs / pyverbs-chain": ratio("ibal-pyverbs", "pyverbs-chain"),
    }
    for name, value in ratios.items():
        print(f"  {name:<28} = {value:.2f}  (median of per-round ratios)")
    if args.json:
        print(json.dumps({"median_msgs_per_s": med, "ratios": ratios, "rounds": results,
                          "datapath": datapath, "args": vars(args)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
