"""ibal's NVMe/RDMA host against ibal's target (ibal.ulp.nvme), two userspace rxe devices
on loopback: the command set end to end, and the bad input a target must answer (the
Linux peers are in tests/lab/test_nvme_lab.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ibal.al import AccessLayer
from ibal.cm import rdma
from ibal.testing.helpers import rxe_al
from ibal.types import SendOpt, SendWr, Sge, WrType
from ibal.ulp.nvme import wire as w
from ibal.ulp.nvme.controller import Namespace, Subsystem
from ibal.ulp.nvme.host import (
    Controller,
    ControllerLost,
    HostOptions,
    HostQueue,
    NvmeStatusError,
    fabrics_connect,
)
from ibal.ulp.nvme.target import Target

HOST, TGT = "127.0.0.81", "127.0.0.82"
NQN = "nqn.2026-12.org.ibal:loopback"
WAIT = 20.0
BLOCK = 512


@pytest.fixture(scope="module")
def al() -> Iterator[AccessLayer]:
    with rxe_al(f"rxe_nv0={HOST},rxe_nv1={TGT}", timeout=WAIT) as al:
        yield al


@pytest.fixture
def target(al: AccessLayer, tmp_path: Path) -> Iterator[Target]:
    img = tmp_path / "ns1.img"
    img.write_bytes(bytes(1 << 20))
    subsys = Subsystem(NQN, [Namespace(1, path=str(img), block=BLOCK)], max_io_queues=4)
    t = Target(al, subsys, TGT, timeout=WAIT)
    try:
        yield t
    finally:
        t.close()
        subsys.close()


def until(what: str, check: Callable[[], object], seconds: float = WAIT) -> None:
    """Bounded wait for state the other side's threads reach in their own time."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def opts(**kw: object) -> HostOptions:
    kw.setdefault("timeout", WAIT)
    return HostOptions(**kw)  # type: ignore[arg-type]


def test_host_and_target_move_blocks(al: AccessLayer, target: Target, tmp_path: Path) -> None:
    with Controller(al, TGT, NQN, opts(io_queues=2, queue_size=8), src=HOST) as ctrl:
        assert len(ctrl.io) == 2 and ctrl.cntlid in target.subsystem.controllers
        assert w.nstr(ctrl.id_ctrl["subnqn"]) == NQN
        assert ctrl.active_namespaces() == [1]
        ctrl.keep_alive()
        dev = ctrl.namespace(1)
        assert (dev.block, dev.blocks) == (BLOCK, 2048)
        rnd = random.Random(5)
        pattern = rnd.randbytes(64 * 1024)
        cids = [(1 + i % 2, ctrl.submit_write(1, 100 + i * 16, pattern[i * 8192 : (i + 1) * 8192],
                                              BLOCK, 1 + i % 2)) for i in range(8)]  # fmt: skip
        for qid, cid in cids:
            ctrl.complete(cid, qid)
        ctrl.flush(1)
        assert ctrl.read(1, 100, 128, BLOCK, 2) == pattern
        dev.seek(100 * BLOCK + 7)
        dev.write(b"partial")
        dev.seek(100 * BLOCK)
        assert dev.read(14) == pattern[:7] + b"partial"
    assert (tmp_path / "ns1.img").read_bytes()[100 * BLOCK + 7 : 100 * BLOCK + 14] == b"partial"
    assert (tmp_path / "ns1.img").read_bytes()[100 * BLOCK + 14 : 228 * BLOCK] == pattern[14:]
    until("the target released the queues", lambda: target.registered() == [])
    assert ctrl.registered() == []
    assert target.subsystem.controllers == {}
    assert target.stats["writes"] == 9 and target.stats["connects"] == 3


def test_in_capsule_writes_and_remote_invalidation(al: AccessLayer, target: Target,
                                                   tmp_path: Path) -> None:  # fmt: skip
    """Writes up to the controller's in-capsule size go in the capsule; with windows, every
    keyed transfer is answered with a SEND that invalidates the command's key."""
    o = opts(io_queues=1, queue_size=4, remote_invalidate=True)
    with Controller(al, TGT, NQN, o, src=HOST) as ctrl:
        q = ctrl.queue(1)
        assert q.inline == 4096
        small, big = b"s" * 4096, b"b" * 8192
        ctrl.write(1, 10, small, BLOCK)
        ctrl.write(1, 20, big, BLOCK)
        assert ctrl.read(1, 10, 8, BLOCK) == small
        assert ctrl.read(1, 20, 16, BLOCK) == big
        assert q.in_capsule_writes == 1 and target.stats["in-capsule data"] == 1
        # the I/O queue's Connect, the big write, the two reads: each key invalidated by
        # the target's response (the in-capsule write had no window)
        assert (q.remote_invalidations, q.local_invalidations) == (4, 0)
    data = (tmp_path / "ns1.img").read_bytes()
    assert data[10 * BLOCK : 18 * BLOCK] == small and data[20 * BLOCK : 36 * BLOCK] == big
    assert ctrl.registered() == []


def _raw(q: HostQueue, cmd: bytes) -> w.Completion:
    cid = q.submit(lambda _cid, _sgl: cmd)
    return q.wait(cid)


def test_bad_capsules_are_answered_with_the_standard_status(al: AccessLayer,
                                                            target: Target) -> None:
    with Controller(al, TGT, NQN, opts(io_queues=1, queue_size=8), src=HOST) as ctrl:
        q = ctrl.queue(1)
        good = q.data_sgl(0, BLOCK)

        def io(op: int, nsid: int, slba: int, sgl: w.Sgl, nblocks: int = 1) -> int:
            def build(cid: int, _: w.Sgl) -> bytes:
                return w.rw_command(w.IoOpcode(op), cid, nsid, slba, nblocks, sgl)

            c = q.wait(q.submit(build))
            return c.status

        bad_subtype = w.Sgl(0x45, good.addr, BLOCK, good.key)
        assert io(w.IoOpcode.READ, 1, 0, bad_subtype) == w.Sc.SGL_INVALID_SUBTYPE | w.DNR
        short = w.Sgl.keyed_addr(good.addr, BLOCK - 1, good.key)
        assert io(w.IoOpcode.READ, 1, 0, short) == w.Sc.SGL_INVALID_DATA | w.DNR
        bad_type = w.Sgl(0x20, good.addr, BLOCK, good.key)
        assert io(w.IoOpcode.READ, 1, 0, bad_type) == w.Sc.SGL_INVALID_TYPE | w.DNR
        # in-capsule data the capsule does not carry
        inline = w.Sgl(w.SglType.DATA_OFFSET, 0, BLOCK)
        assert io(w.IoOpcode.WRITE, 1, 0, inline) == w.Sc.SGL_INVALID_OFFSET | w.DNR
        assert io(w.IoOpcode.READ, 1, 2047, w.Sgl.keyed_addr(good.addr, 2 * BLOCK, good.key),
                  2) == w.Sc.LBA_RANGE | w.DNR  # fmt: skip
        assert io(w.IoOpcode.READ, 7, 0, good) == w.Sc.INVALID_NS | w.DNR
        c = _raw(q, w.command(0x7E, 0, nsid=1))
        assert c.status == w.Sc.INVALID_OPCODE | w.DNR
    assert target.stats["bad: SGL subtype"] == 1 and target.stats["bad: LBA range"] == 1


def test_admin_opcode_unknown_is_invalid_opcode(al: AccessLayer, target: Target) -> None:
    with Controller(al, TGT, NQN, opts(io_queues=1, queue_size=4), src=HOST) as ctrl:
        with pytest.raises(NvmeStatusError) as ei:
            ctrl.admin_call(lambda cid, _: w.command(0x55, cid), "opcode 0x55")
        assert ei.value.nvme_status == w.Sc.INVALID_OPCODE | w.DNR
        with pytest.raises(NvmeStatusError) as ei:
            ctrl.get_log_page(0x42, 512)
        assert ei.value.code == w.Sc.INVALID_LOG_PAGE
        # a SMART page of 16 GiB: refused before anything that large is made
        huge = w.get_log_page(0, w.LogPage.SMART, 4, w.NULL_SGL)
        huge = huge[:40] + (0xFFFF0002).to_bytes(4, "little") + b"\xff\xff" + huge[46:]
        c = _raw(ctrl.admin, huge)
        assert c.status == w.Sc.INVALID_FIELD | w.DNR
        assert ctrl.read(1, 0, 1, BLOCK) == bytes(BLOCK)  # the controller still serves


def test_short_capsule_is_dropped_and_counted(al: AccessLayer, target: Target) -> None:
    with Controller(al, TGT, NQN, opts(io_queues=1, queue_size=4), src=HOST) as ctrl:
        q = ctrl.queue(1)
        q.qp.post_send(SendWr(wr_id=99, opcode=WrType.SEND, send_opt=SendOpt.SIGNALED,
                              sg_list=[Sge(addr=q.cmd_mr.vaddr, length=20,
                                           lkey=q.cmd_mr.lkey)]))  # fmt: skip
        until("the short capsule counted", lambda: target.stats["dropped: short capsule"] == 1)
        assert ctrl.read(1, 0, 1, BLOCK) == bytes(BLOCK)


def test_queue_overrun_is_answered(al: AccessLayer, target: Target) -> None:
    """An admin queue that says 2 entries: Connect, then two Asynchronous Event Requests
    (held by the target, so the queue is full), then a third: that one overruns and is
    answered Command Sequence Error (the RDMA transport gives no status of its own)."""
    route = rdma.resolve_route(al, TGT, src=HOST)
    o = opts()
    q = HostQueue(al, route, 0, 8, 4096, o, claim=2)
    try:
        cntlid = fabrics_connect(q, o, NQN, w.CNTLID_DYNAMIC, 0)
        assert cntlid in target.subsystem.controllers
        aer = [q.submit(lambda cid, _: w.command(w.AdminOpcode.ASYNC_EVENT, cid))
               for _ in range(3)]  # fmt: skip
        assert q.wait(aer[2]).status == w.Sc.CMD_SEQ_ERROR | w.DNR
    finally:
        q.close()
    assert target.stats["bad: queue overrun"] == 1
    until("the target released the queue", lambda: target.registered() == [])


def test_wrong_key_ends_the_queue_and_writes_nothing(al: AccessLayer, target: Target,
                                                     tmp_path: Path) -> None:  # fmt: skip
    ctrl = Controller(al, TGT, NQN, opts(io_queues=1, queue_size=4, timeout=10), src=HOST)
    try:
        q = ctrl.queue(1)
        q.data[:BLOCK] = b"\xee" * BLOCK
        good = q.data_sgl(0, BLOCK)
        forged = w.Sgl.keyed_addr(good.addr, BLOCK, good.key ^ 0x5A5A00)

        def build(cid: int, _: w.Sgl) -> bytes:
            return w.rw_command(w.IoOpcode.WRITE, cid, 1, 5, 1, forged)

        with pytest.raises(ControllerLost):
            q.wait(q.submit(build))
    finally:
        ctrl.close()
    assert ctrl.registered() == []
    until("the target ended the queue", lambda: target.registered() == [])
    assert any(k.startswith("queue ended: RDMA_READ") for k in target.stats)
    assert (tmp_path / "ns1.img").read_bytes()[5 * BLOCK : 6 * BLOCK] == bytes(BLOCK)


def test_connect_request_refused_with_nvme_rdma_status(al: AccessLayer, target: Target) -> None:
    route = rdma.resolve_route(al, TGT, src=HOST)
    with pytest.raises(ControllerLost, match="INVALID_QID"):
        HostQueue(al, route, 9, 4, 4096, opts())
    with pytest.raises(ControllerLost, match="INVALID_HSQSIZE"):
        HostQueue(al, route, 0, 4, 4096, opts(), claim=64)  # an admin queue past 32
    assert target.stats["rejected: INVALID_QID"] == 1
    assert target.registered() == []
