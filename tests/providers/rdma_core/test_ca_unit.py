"""RdmaCoreCa verbs whose rules live in the provider, on a CA without a device.

The CA object is built without ``__init__`` (no pyverbs, no device) and given
only what the verb under test touches; the queues are the real ones over the
fake libibverbs of ``test_translation``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from test_translation import FakeLib, FakeRdmaError, fast_queue, write

from ibal.providers.rdma_core.ca import RdmaCoreCa
from ibal.providers.rdma_core.fastpath import FastRecvQueue
from ibal.providers.rdma_core.handles import Cq as _Cq
from ibal.providers.rdma_core.handles import Qp as _Qp
from ibal.providers.rdma_core.nethdr import ReceiveAreas
from ibal.providers.rdma_core.quirks import RxeQuirks
from ibal.providers.rdma_core.wr import RecvTokens
from ibal.status import InvalidParameter, PostError
from ibal.types import QpCaps, QpState, QpType, RecvWr, Sge, WcStatus, WcType, WrType


class SpyLock:
    """A lock that notes, at each release, what ``probe()`` says."""

    def __init__(self, probe: Any) -> None:
        self._lock = threading.Lock()
        self.probe = probe
        self.seen: list[Any] = []

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.seen.append(self.probe())
        self._lock.release()


class FakePv:
    def __init__(self) -> None:
        self.freed = False

    def close(self) -> None:
        self.freed = True


def bare_ca(*, rxe: bool = False) -> Any:
    ca: Any = object.__new__(RdmaCoreCa)
    ca._lock = threading.RLock()
    ca._loop = None
    ca._errs = SimpleNamespace(PyverbsError=FakeRdmaError)
    ca._qps = {}
    ca._n = {"qp": 1}
    ca._ud_qpns = set()
    ca._sq_accts = {}
    ca._errored = set()
    ca._ip_groups = None
    ca._areas = ReceiveAreas()
    ca.tokens = RecvTokens()
    ca.rxe = rxe
    ca.quirks = RxeQuirks(rxe, "fake0", None, FakeRdmaError)
    ca.name = "fake0"
    return ca


def bare_qp(ca: Any, lib: FakeLib, state: QpState = QpState.RTS) -> Any:
    users = SimpleNamespace(users=1)
    qp = _Qp(ca, users, QpType.RC, None)  # type: ignore[arg-type]
    qp.num = 5
    qp.state = state
    qp.pv = FakePv()
    qp.sq = fast_queue(lib)
    qp.rq = FastRecvQueue(lib.post_recv, 0xDEF, max_sge=1, tokens=ca.tokens, owner=qp)
    qp.send_cq = qp.recv_cq = SimpleNamespace(users=2)
    qp.caps = QpCaps(rq_depth=8)
    ca._qps[qp.num] = qp
    return qp


def test_destroy_closes_the_queues_before_it_releases_their_locks() -> None:
    """A post waiting on the queue lock while the QP is destroyed must not reach the freed QP."""
    ca = bare_ca()
    qp = bare_qp(ca, FakeLib())
    spy = SpyLock(lambda: (qp.pv.freed, qp.sq.closed))
    qp.sq.lock = spy
    ca.destroy_qp(qp)
    assert qp.pv.freed
    # every release of the queue lock after the ibv_qp was freed saw it closed
    assert all(closed for freed, closed in spy.seen if freed) and spy.seen
    with pytest.raises(PostError) as info:
        qp.sq.post([write(1)])  # what the waiting poster does once it has the lock
    assert info.value.status is InvalidParameter.status


@pytest.mark.parametrize("rxe", [False, True])
def test_sends_posted_in_sqd_are_held_only_on_rxe(rxe: bool) -> None:
    lib = FakeLib()
    ca = bare_ca(rxe=rxe)
    qp = bare_qp(ca, lib, QpState.SQD)
    ca.post_send(qp, [write(1), write(2)])
    if rxe:  # rxe does not restart a drained queue: held until SQD -> RTS
        assert lib.sent == [] and len(qp.sq.held) == 1
    else:  # a device queues them itself
        assert [s["wr_id"] for s in lib.sent] == [1, 2] and qp.sq.held == []


@pytest.mark.parametrize("rxe", [False, True])
def test_receives_in_error_kick_the_flush_only_on_rxe(rxe: bool) -> None:
    lib = FakeLib()
    ca = bare_ca(rxe=rxe)
    qp = bare_qp(ca, lib, QpState.ERROR)
    kicked: list[int] = []
    ca.quirks.reenter_error = lambda q: kicked.append(q.num)
    ca.post_recv(qp, [RecvWr(1, [Sge(0x10, 8, 1)])])
    assert len(lib.recvd) == 1
    assert kicked == ([5] if rxe else [])


def test_flushed_sends_complete_after_the_devices_and_upcall_once() -> None:
    ca = bare_ca()
    qp = bare_qp(ca, FakeLib())
    cq = _Cq(ca, "cq-context")
    cq.poller = SimpleNamespace(poll=lambda n: ())  # type: ignore[assignment]
    qp.send_cq = cq
    upcalls: list[Any] = []
    ca._open = SimpleNamespace(completion_cb=upcalls.append)
    cq.armed = True
    ca._complete_flushed(qp, [(7, WrType.SEND), (8, WrType.RDMA_WRITE)])
    ca._complete_flushed(qp, [(9, WrType.SEND)])
    assert upcalls == ["cq-context"]  # armed once, one callback
    first = ca.poll_cq(cq, 2)
    rest = ca.poll_cq(cq, 16)
    assert [(w.wr_id, w.wc_type, w.status) for w in first + rest] == [
        (7, WcType.SEND, WcStatus.WR_FLUSHED_ERR),
        (8, WcType.RDMA_WRITE, WcStatus.WR_FLUSHED_ERR),
        (9, WcType.SEND, WcStatus.WR_FLUSHED_ERR),
    ]
    assert ca.poll_cq(cq, 16) == []
