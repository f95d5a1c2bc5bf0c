"""Chapters: thread safety and the asyncio bridge."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import InsufficientResources, InvalidCqHandle, InvalidQpHandle, Timeout
from ibal.testing.helpers import (
    DEFAULT_TIMEOUT,
    CallbackLog,
    Source,
    drain,
    wait_until,
    wait_wcs,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase
from ibal.types import AccessFlags, PortAttr, QpType, SendWr, WcStatus, WrType

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.testing.helpers import Pair


def run_threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    """Run ``target(i)`` on ``n`` threads started together; return what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait(DEFAULT_TIMEOUT)
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * DEFAULT_TIMEOUT)
        assert not t.is_alive(), "a worker thread hung"
    return errors


def writes(pair: Pair, first_id: int, count: int, dst: int) -> list[SendWr]:
    return [
        SendWr(
            wr_id=first_id + i,
            opcode=WrType.RDMA_WRITE,
            sg_list=[pair.a.sge(0, 8)],
            remote_addr=pair.b.remote(dst),
            rkey=pair.b.mr.rkey,
        )
        for i in range(count)
    ]


class ThreadChecks(ConformanceBase):
    chapter = "thread safety"

    @rules("doc:api.md", "doc:ci-contract §0")
    def test_threads_posting_on_separate_qps(self, ca: Ca, port: PortAttr) -> None:
        """api.md / ci-contract §0: verbs may be called from several threads; each QP's WRs all
        complete."""
        pairs = [self.loop(ca, port, QpType.RC, sq_depth=64) for _ in range(4)]

        def work(i: int) -> None:
            p = pairs[i]
            for batch in range(5):
                p.a.qp.post_send(writes(p, 100 * batch, 10, 64 * i))
                got = wait_wcs(p.a.cq, 10)
                assert [w.wr_id for w in got] == [100 * batch + k for k in range(10)]
                assert all(w.status is WcStatus.SUCCESS for w in got)

        assert run_threads(4, work) == []

    @rules("doc:ci-contract §0")
    def test_threads_posting_on_one_qp(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §0: concurrent posts to one QP neither lose nor duplicate work requests."""
        pair = self.loop(ca, port, QpType.RC, sq_depth=256, cq_size=1024)

        def work(i: int) -> None:
            for k in range(0, 40, 8):
                pair.a.qp.post_send(writes(pair, 1000 * i + k, 8, 8 * i))

        assert run_threads(4, work) == []
        got = wait_wcs(pair.a.cq, 160)
        ids = sorted(w.wr_id for w in got)
        assert ids == sorted(1000 * i + k for i in range(4) for k in range(40))
        for i in range(4):  # each thread's WRs complete in the order that thread posted them
            mine = [w.wr_id for w in got if w.wr_id // 1000 == i]
            assert mine == sorted(mine)

    @rules("doc:ci-contract §0")
    def test_threads_creating_and_destroying(self, ca: Ca) -> None:
        """ci-contract §0: concurrent create/destroy of PDs, CQs and MRs keeps every object
        valid."""

        def work(i: int) -> None:
            for _ in range(10):
                pd = ca.alloc_pd()
                cq = ca.create_cq(8)
                mr = pd.reg_mem(bytearray(128), AccessFlags.LOCAL_WRITE)
                assert mr.query().pd is pd
                mr.dereg()
                cq.destroy(wait=True)
                pd.dealloc(wait=True)

        assert run_threads(4, work) == []
        ca.close(wait=True)

    @rules("doc:ci-contract §0")
    def test_threads_polling_one_cq(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §0: two threads polling one CQ see every completion exactly once."""
        cq = ca.create_cq(512)
        src = Source(ca, port, send_cq=cq)
        ids = src.fire(60)
        seen: list[int] = []
        lock = threading.Lock()

        def work(i: int) -> None:
            def step() -> bool:
                got = cq.poll(4)
                with lock:
                    seen.extend(w.wr_id for w in got)
                    return len(seen) >= 60

            wait_until(step, "60 completions between two pollers")

        assert run_threads(2, work) == []
        assert sorted(seen) == ids

    @rules("doc:ci-contract §2.10")
    def test_callback_may_poll_and_rearm(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.10 pattern: a completion callback polls, rearms and polls again without
        deadlock."""
        got: list[int] = []
        done = threading.Event()

        def comp_cb(cq: Any, ctx: Any) -> None:
            while True:
                batch = cq.poll(8)
                if not batch:
                    cq.rearm()
                    batch = cq.poll(8)
                    if not batch:
                        break
                got.extend(w.wr_id for w in batch)
            if len(got) >= 50:
                done.set()

        cq = ca.create_cq(256, comp_cb=comp_cb)
        src = Source(ca, port, send_cq=cq)
        cq.rearm()
        ids = src.fire(25)
        ids += src.fire(25)
        assert done.wait(self.timeout), f"callbacks consumed {len(got)} of 50"
        assert got == ids

    @rules("ci:62")
    def test_destroy_while_another_thread_posts(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 62 / api.md: a QP destroyed under a posting thread refuses further posts
        cleanly."""
        pair = self.loop(ca, port, QpType.RC, sq_depth=64, cq_size=4096)
        stop = threading.Event()
        failures: list[BaseException] = []
        started = threading.Event()

        def poster() -> None:
            n = 0
            while not stop.is_set():
                try:
                    pair.a.qp.post_send(writes(pair, n, 1, 0))
                    n += 1
                    started.set()
                    drain(pair.a.cq)
                except InvalidQpHandle:
                    return
                except InvalidCqHandle:
                    return
                except InsufficientResources:
                    drain(pair.a.cq)  # queue full: fine
                except BaseException as exc:  # anything else, IbError or not, is a failure
                    failures.append(exc)
                    return

        t = threading.Thread(target=poster)
        t.start()
        assert started.wait(self.timeout)
        pair.a.qp.destroy(wait=True)
        t.join(self.timeout)
        stop.set()
        t.join(self.timeout)
        assert not t.is_alive()
        assert failures == [], f"the posting thread raised {failures[0]!r}"


class AsyncioChecks(ConformanceBase):
    chapter = "asyncio"

    @rules("doc:api.md")
    def test_poll_async_returns_completion(self, ca: Ca, port: PortAttr) -> None:
        """api.md: await cq.poll_async() returns once a completion arrives."""
        cq = ca.create_cq(64)
        src = Source(ca, port, send_cq=cq)

        async def main() -> list[int]:
            task = asyncio.create_task(cq.poll_async(1, timeout=self.timeout))
            await asyncio.sleep(0)
            src.fire(1)
            return [w.wr_id for w in await task]

        assert asyncio.run(main()) == [1]

    @rules("doc:api.md")
    def test_poll_async_waits_for_min_entries(self, ca: Ca, port: PortAttr) -> None:
        """api.md: poll_async(min_entries=n) collects at least n completions, in order."""
        cq = ca.create_cq(64)
        src = Source(ca, port, send_cq=cq)

        async def main() -> list[int]:
            task = asyncio.create_task(cq.poll_async(5, timeout=self.timeout))
            await asyncio.sleep(0)
            src.fire(2)
            await asyncio.sleep(0)
            src.fire(3)
            return [w.wr_id for w in await task]

        got = asyncio.run(main())
        assert got[:5] == [1, 2, 3, 4, 5]

    @rules("doc:api.md")
    def test_poll_async_timeout_returns_what_it_has(self, ca: Ca) -> None:
        """api.md (poll_async): on timeout it returns the completions it has (none here)."""
        cq = ca.create_cq(8)
        try:
            got = asyncio.run(cq.poll_async(1, timeout=0.01))
        except (Timeout, TimeoutError):
            return  # raising on timeout is the other acceptable reading
        assert got == []

    @rules("doc:api.md")
    def test_poll_async_two_cqs_concurrently(self, ca: Ca, port: PortAttr) -> None:
        """api.md: several poll_async waits run side by side in one event loop."""
        c1, c2 = ca.create_cq(32), ca.create_cq(32)
        s1, s2 = Source(ca, port, send_cq=c1), Source(ca, port, send_cq=c2)

        async def main() -> tuple[list[Any], list[Any]]:
            t1 = asyncio.create_task(c1.poll_async(2, timeout=self.timeout))
            t2 = asyncio.create_task(c2.poll_async(3, timeout=self.timeout))
            await asyncio.sleep(0)
            s2.fire(3)
            s1.fire(2)
            return await t1, await t2

        r1, r2 = asyncio.run(main())
        assert len(r1) >= 2 and len(r2) >= 3
        assert {w.qp_num for w in r1} == {s1.a.qp.num} and {w.qp_num for w in r2} == {s2.a.qp.num}

    @rules("doc:api.md")
    def test_destroy_async_completes(self, ca: Ca) -> None:
        """api.md: await obj.destroy_async() returns when the destroy is complete."""
        pd = ca.alloc_pd()
        cq = ca.create_cq(8)

        async def main() -> None:
            await pd.destroy_async()
            await cq.destroy_async()

        asyncio.run(main())
        with pytest.raises(InvalidCqHandle):
            cq.poll()
        ca.close(wait=True)

    @rules("doc:api.md")
    def test_poll_async_on_destroyed_cq_raises(self, ca: Ca) -> None:
        """api.md: poll_async on a destroyed CQ → IB_INVALID_CQ_HANDLE."""
        cq = ca.create_cq(8)
        cq.destroy(wait=True)
        with pytest.raises(InvalidCqHandle):
            asyncio.run(cq.poll_async(1, timeout=1))

    @rules("doc:api.md")
    def test_poll_async_woken_by_destroy(self, ca: Ca) -> None:
        """api.md: a poll_async waiting on a CQ that gets destroyed ends with
        IB_INVALID_CQ_HANDLE."""
        cq = ca.create_cq(8)
        log = CallbackLog()

        async def main() -> None:
            task = asyncio.create_task(cq.poll_async(1, timeout=self.timeout))
            await asyncio.sleep(0)  # let it start waiting (if not, it fails the same way)
            cq.destroy(log)
            with pytest.raises(InvalidCqHandle):
                await task

        asyncio.run(main())
