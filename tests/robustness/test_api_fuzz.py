"""Hypothesis over the public API: junk in every argument, only ibal statuses out.

Issue 25 §3.  Each call gets values drawn from ints of any width and sign,
floats (NaN, infinities), text, bytes, ``None``, lists, bare objects and dead
buffers.  A call may succeed or raise an :class:`~ibal.status.IbError`; any
other exception is a defect, and after every call the manager's threads must
all still run.  Outcome classes are counted per call (``-s`` prints them; the
figures are in docs/testing.md).
"""

from __future__ import annotations

import collections
import mmap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from robust_world import World, close_world_parts, open_world

import ibal
import ibal.cm
from ibal.al import QpCreate
from ibal.status import IbError
from ibal.testing.helpers import make_pair
from ibal.types import (
    AvAttr,
    BindWr,
    Grh,
    PortAttrMod,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    SrqAttr,
    UdDest,
)


def _released_view() -> memoryview:
    mv = memoryview(bytearray(16))
    mv.release()
    return mv


def _closed_mmap() -> mmap.mmap:
    mm = mmap.mmap(-1, 4096)
    mm.close()
    return mm


JUNK = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**8, 2**16, 2**24, 2**32, 2**64, 2**24 - 1, 2**32 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=20),
    st.none(),
    st.booleans(),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.sampled_from([object(), QpState.RTS, QpType.UD, "RTS", "::1", "fe80::1"]),
    st.builds(_released_view),
    st.builds(_closed_mmap),
    st.sampled_from([b"read-only", bytearray(0)]),
)

Call = Callable[["Env", list[Any]], object]


class Env:
    """The objects the calls work on (made once per test, rebuilt if a call broke them)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.pair = make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.RC)
        self.ud = make_pair(w.ca0, w.p0, w.ca1, w.p1, QpType.UD)


def _sendwr(e: Env, j: list[Any]) -> object:
    a = e.pair.a
    return a.qp.post_send(SendWr(wr_id=j[0], opcode=j[1], sg_list=[Sge(a.mr.vaddr, j[2], j[3])],
                                 send_opt=j[4], imm=j[5], remote_addr=j[6], rkey=j[7]))  # fmt: skip


def _udwr(e: Env, j: list[Any]) -> object:
    a = e.ud.a
    assert a.av is not None
    sgl = j[0] if isinstance(j[0], list) else [a.sge(0, 8)]
    ud = UdDest(j[1] if j[2] is None else a.av, j[3], j[4], j[5])
    return a.qp.post_send(SendWr(wr_id=1, sg_list=sgl, ud=ud))


CALLS: dict[str, Call] = {
    "al.open_ca": lambda e, j: e.w.al.open_ca(j[0]),
    "al.query_ca_by_guid": lambda e, j: e.w.al.query_ca_by_guid(j[0]),
    "al.get_ca_by_gid": lambda e, j: e.w.al.get_ca_by_gid(j[0]),
    "al.get_port_by_gid": lambda e, j: e.w.al.get_port_by_gid(j[0]),
    "al.get_guid": lambda e, j: e.w.al.get_guid(j[0], j[1], j[2]),
    "al.timers.call_later": lambda e, j: e.w.al.timers.call_later(j[0], lambda: None).cancel(),
    "ca.alloc_pd": lambda e, j: e.w.ca0.alloc_pd(j[0]),
    "ca.create_cq": lambda e, j: e.w.ca0.create_cq(j[0]),
    "ca.query_port": lambda e, j: e.w.ca0.query_port(j[0]),
    "ca.find_gid": lambda e, j: e.w.ca0.find_gid(j[0], j[1]),
    "ca.find_pkey": lambda e, j: e.w.ca0.find_pkey(j[0], j[1]),
    "ca.gid_entry": lambda e, j: e.w.ca0.gid_entry(j[0], j[1]),
    "ca.query_port_counters": lambda e, j: e.w.ca0.query_port_counters(j[0]),
    "pd.reg_mem": lambda e, j: e.pair.a.pd.reg_mem(j[0], j[1]),
    "pd.create_mw": lambda e, j: e.pair.a.pd.create_mw(j[0]),
    "pd.create_av": lambda e, j: e.pair.a.pd.create_av(AvAttr(j[0], j[1], j[2], None, j[3], j[4])),
    "pd.create_av grh": lambda e, j: e.pair.a.pd.create_av(
        AvAttr(e.w.p0.port_num, grh=Grh(j[0], j[1], j[2], j[3], j[4]))),
    "pd.create_qp": lambda e, j: e.pair.a.pd.create_qp(
        QpCreate(j[0], e.pair.a.cq if j[1] is None else j[1], e.pair.a.cq, j[2], j[3], j[4], j[5])),
    "pd.create_srq": lambda e, j: e.pair.a.pd.create_srq(SrqAttr(j[0], j[1], j[2])),
    "mr.sge": lambda e, j: e.pair.a.mr.sge(j[0], j[1]),
    "qp.modify": lambda e, j: e.pair.a.qp.modify(QpMod(j[0], qkey=j[1], sq_psn=j[2])),
    "qp.modify path": lambda e, j: e.pair.a.qp.modify(
        QpMod(QpState.RTS, primary_av=AvAttr(j[0], j[1], j[2]), retry_cnt=j[3])),
    "qp.post_send": _sendwr,
    "qp.post_send ud": _udwr,
    "qp.post_recv": lambda e, j: e.pair.b.qp.post_recv(
        RecvWr(j[0], [Sge(e.pair.b.mr.vaddr, j[1], j[2])] if j[3] is None else j[3])),
    "qp.attach_mcast": lambda e, j: e.ud.a.qp.attach_mcast(j[0], j[1]),
    "qp.drain": lambda e, j: e.pair.a.qp.drain(j[0] if j[0] is None or not
                                               isinstance(j[0], int | float) else 0.01),
    "cq.poll": lambda e, j: e.pair.a.cq.poll(j[0]),
    "cq.modify": lambda e, j: e.pair.a.cq.modify(j[0]),
    "cq.rearm_n": lambda e, j: e.pair.a.cq.rearm_n(j[0]),
    "endpoint": lambda e, j: ibal.endpoint(j[0], j[1], psn=j[2], qkey=j[3], gid_index=j[4]),
    "endpoint of a qp": lambda e, j: ibal.endpoint(e.pair.a.qp, j[0], psn=j[1], qkey=j[2]),
    "connect_qp": lambda e, j: ibal.connect_qp(e.pair.a.qp, j[0], j[1], psn=j[2]),
}

def _cm_connect(e: Env, j: list[Any]) -> object:
    import ibal.cm

    qp = e.pair.a.pd.create_qp(QpCreate(QpType.RC, e.pair.a.cq, e.pair.a.cq))
    try:
        key = j[2] if isinstance(j[2], str) and j[2].isidentifier() else "retry_cnt"
        conn = ibal.cm.connect(e.w.al, qp if j[3] is None else j[3], j[0], j[1],
                               callback=lambda c: None, **{key: j[4]})  # fmt: skip
        conn.disconnect(wait=False)
        return conn
    finally:
        qp.destroy()


def _sa_paths(e: Env, j: list[Any]) -> object:
    import ibal.sa

    return ibal.sa.path_records(e.w.al, j[0], j[1], sl=j[2], pkey=j[3], timeout_ms=j[4] if
                                isinstance(j[4], int) and 0 < j[4] < 50 else 20, retry_cnt=0)


def _open_al(e: Env, j: list[Any]) -> object:
    al = ibal.open_al(providers=j[0] if not isinstance(j[1], str) else {j[1]: j[2]})
    al.close()
    return al


CALLS.update({
    "cm.connect": _cm_connect,
    "cm.listen": lambda e, j: ibal.cm.listen(e.w.al, j[0], **(
        {j[1]: j[2]} if isinstance(j[1], str) and j[1].isidentifier() else {})).close(),
    "sa.path_records": _sa_paths,
    "open_al": _open_al,
    "cq.wait": lambda e, j: e.pair.a.cq.wait(0.001 if isinstance(j[0], int | float) else j[0],
                                             j[1], min_entries=j[2]),
    "qp.init_dgrm_svc": lambda e, j: e.pair.a.pd.create_qp(
        QpCreate(QpType.UD, e.pair.a.cq, e.pair.a.cq)).init_dgrm_svc(j[0]),
    "pd.reg_shmid": lambda e, j: e.pair.a.pd.reg_shmid(j[0], j[1], j[2]),
    "pd.get_spl_qp": lambda e, j: e.pair.a.pd.get_spl_qp(j[0], j[1]),
    "mr.rereg": lambda e, j: e.pair.a.pd.reg_mem(bytearray(64), 8).rereg(
        j[0], buffer=j[1], access=j[2], pd=j[3]),
    "ca.local_mad": lambda e, j: e.w.ca0.local_mad(j[0], j[1]),
    "ca.modify": lambda e, j: e.w.ca0.modify(j[0], j[1], PortAttrMod(j[2], j[3], j[4])),
    "mw.bind": lambda e, j: e.pair.a.pd.create_mw(1).bind(e.pair.a.qp, BindWr(
        e.pair.a.mr if j[0] is None else j[0], j[1], j[2], j[3], j[4], j[5])),
    "srq.post_recv": lambda e, j: e.pair.a.pd.create_srq(SrqAttr()).post_recv(
        RecvWr(j[0], [Sge(e.pair.a.mr.vaddr, j[1], j[2])] if j[3] is None else j[3])),
})

OUTCOMES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
EXAMPLES = 25


@pytest.fixture(scope="module", params=["mock", "rxe"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    w = open_world(request.param)
    try:
        yield Env(w)
    finally:
        close_world_parts(w.provider, w.mgr)


def _threads_alive(w: World) -> list[str]:
    names = {t.name for t in threading.enumerate()}
    return [n for n in names if n.startswith(("ibal-", "rxe_bad"))]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_junk_arguments_give_ibal_statuses(env: Env, name: str) -> None:
    call = CALLS[name]
    before = _threads_alive(env.w)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.lists(JUNK, min_size=8, max_size=8))
    def run(junk: list[Any]) -> None:
        try:
            call(env, junk)
            outcome = "accepted"
        except IbError as e:
            outcome = type(e).__name__
        except Exception as e:  # the defect this test is for
            raise AssertionError(f"{name}{tuple(junk)!r:.300}: {type(e).__name__}: {e}") from e
        OUTCOMES[f"{env.w.name} {name}"][outcome] += 1
        if env.pair.a.qp.state is not QpState.RTS or env.pair.b.qp.state is not QpState.RTS:
            env.pair = make_pair(env.w.ca0, env.w.p0, env.w.ca1, env.w.p1, QpType.RC)

    run()
    assert set(before) <= set(_threads_alive(env.w))  # lazily started ones may join


def test_zz_report_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the outcome classes counted above (for docs/testing.md)."""
    with capsys.disabled():
        total = sum(sum(c.values()) for c in OUTCOMES.values())
        classes: collections.Counter[str] = collections.Counter()
        for c in OUTCOMES.values():
            classes.update(c)
        print(f"\napi fuzz: {total} calls, {len(OUTCOMES)} call kinds; outcomes {dict(classes)}")
