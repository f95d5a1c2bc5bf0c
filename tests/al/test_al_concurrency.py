"""Several threads at once, and asyncio."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AccessLayer, AlManager, Ca, Cq, PnpClass, QpCreate
from ibal.status import IbError, InvalidCqHandle
from ibal.types import AccessFlags, AvAttr, QpType, SrqAttr, Wc, WcType

WAIT = 30.0


def test_threads_creating_and_destroying(provider: FakeProvider) -> None:
    mgr = AlManager()
    mgr.add_provider(provider)
    errors: list[BaseException] = []
    callbacks = [0]
    lock = threading.Lock()
    start = threading.Barrier(6)

    def comp(cq: Cq, ctx: threading.Event) -> None:
        with lock:
            callbacks[0] += 1
        ctx.set()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            al = mgr.open_al()
            start.wait(WAIT)
            for round_ in range(15):
                ci = provider.cis[rnd.randrange(2)]
                ca = al.open_ca(ci.guid, context=seed)
                pd = ca.alloc_pd()
                delivered = threading.Event()
                cq = ca.create_cq(64, comp_cb=comp, context=delivered)
                cq.rearm()
                objs: list[Any] = []
                for _ in range(rnd.randrange(1, 5)):
                    objs.append(pd.create_qp(QpCreate(QpType.RC, cq, cq)))
                    objs.append(pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE))
                    objs.append(pd.create_av(AvAttr(port_num=1)))
                srq = pd.create_srq(SrqAttr(max_wr=4))
                ci.complete(cq._h, Wc(round_, WcType.SEND))
                assert delivered.wait(WAIT)
                rnd.shuffle(objs)
                for obj in objs[: len(objs) // 2]:
                    destroy = getattr(obj, "destroy", None) or obj.dereg
                    destroy()
                if rnd.random() < 0.5:
                    pd.dealloc()
                    del srq
                ca.close(wait=rnd.random() < 0.5)
            al.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pnp_seen: list[int] = []
    watcher = mgr.open_al()
    watcher.reg_pnp(PnpClass.PORT, lambda rec: pnp_seen.append(rec.event))

    def flapper() -> None:
        try:
            start.wait(WAIT)
            from ibal.types import LinkState

            for i in range(40):
                provider.cis[i % 2].set_port_state(1 + i % 2, LinkState.DOWN if i % 4 < 2
                                                   else LinkState.ACTIVE)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(5)]
    threads.append(threading.Thread(target=flapper))
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert not errors, errors
    watcher.close()
    assert mgr.dispatcher.flush(WAIT)
    assert callbacks[0] == 5 * 15 and pnp_seen
    for ci in provider.cis:
        assert ci.live_kinds() == []  # every AL resource went back to the provider
    mgr.close()
    assert all(ci.ca is None for ci in provider.cis)


def _use(cq: Cq, go: threading.Barrier, results: list[str]) -> None:
    go.wait(WAIT)
    for _ in range(50):
        try:
            cq.query()
        except InvalidCqHandle:
            results.append("invalid")
            return
    results.append("done")


def _kill(cq: Cq, go: threading.Barrier, results: list[str]) -> None:
    go.wait(WAIT)
    try:
        cq.destroy(wait=True)
        results.append("destroyed")
    except InvalidCqHandle:
        results.append("lost")


def test_concurrent_destroy_and_use_of_one_object(ca: Ca, ci: FakeCi) -> None:
    for _ in range(30):
        cq = ca.create_cq(16)
        go = threading.Barrier(3)
        results: list[str] = []
        ts = [threading.Thread(target=f, args=(cq, go, results)) for f in (_use, _kill, _kill)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(WAIT)
        assert sorted(results).count("destroyed") == 1 and "lost" in results
    assert ci.verbs().count("destroy_cq") == 30  # each CQ destroyed once at the provider


def test_poll_async_waits_for_completions(ca: Ca, ci: FakeCi) -> None:
    cq = ca.create_cq(32)

    async def main() -> list[Wc]:
        loop = asyncio.get_running_loop()
        # Completions arrive from another thread while the coroutine waits.
        loop.call_later(0.01, lambda: threading.Thread(
            target=lambda: [ci.complete(cq._h, Wc(i, WcType.RECV)) for i in range(3)]).start())
        return await cq.poll_async(min_entries=3, timeout=WAIT)

    got = asyncio.run(main())
    assert [w.wr_id for w in got] == [0, 1, 2]


def test_poll_async_returns_at_once_and_times_out_with_what_it_has(ca: Ca, ci: FakeCi) -> None:
    cq = ca.create_cq(32)
    ci.complete(cq._h, Wc(7, WcType.SEND))
    assert [w.wr_id for w in asyncio.run(cq.poll_async())] == [7]
    ci.complete(cq._h, Wc(8, WcType.SEND))
    got = asyncio.run(cq.poll_async(min_entries=2, timeout=0.05))
    assert [w.wr_id for w in got] == [8]  # fewer than asked, nothing lost
    with pytest.raises(IbError):
        asyncio.run(cq.poll_async(min_entries=0))


def test_poll_async_is_woken_by_destroy(ca: Ca) -> None:
    cq = ca.create_cq(8)

    async def main() -> None:
        waiter = asyncio.ensure_future(cq.poll_async())
        await asyncio.sleep(0)  # let it arm and park
        await asyncio.to_thread(cq.destroy)
        with pytest.raises(InvalidCqHandle):
            await asyncio.wait_for(waiter, WAIT)

    asyncio.run(main())


def test_destroy_async(al: AccessLayer, ca: Ca, ci: FakeCi) -> None:
    async def main() -> None:
        pd = ca.alloc_pd()
        mr = pd.reg_mem(bytearray(8), AccessFlags.LOCAL_WRITE)
        await mr.destroy_async()  # synchronous kinds just destroy
        cq = ca.create_cq(8)
        pd.create_qp(QpCreate(QpType.RC, cq, cq))
        await pd.destroy_async()
        assert "deallocate_pd" in ci.verbs()
        await cq.destroy_async()
        await ca.destroy_async()

    asyncio.run(main())
    assert ci.live_kinds() == []
