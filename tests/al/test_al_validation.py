"""Handle validation: destroyed, foreign and wrong-type handles, for every handle kind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from al_fakes import FakeCi, FakeProvider

from ibal.al import AccessLayer, AlManager, PnpClass, QpCreate
from ibal.status import (
    IbError,
    InvalidAlHandle,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidHandle,
    InvalidMcastHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
    PostError,
    Status,
)
from ibal.types import (
    AccessFlags,
    AvAttr,
    BindWr,
    CaMod,
    CiOp,
    DgrmInfo,
    Gid,
    MrModMask,
    PortAttrMod,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    SrqAttr,
    SrqAttrMask,
    UdDest,
    WrType,
)

RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE


class World:
    """One of every handle kind, on CA 0 of an AL."""

    def __init__(self, al: AccessLayer, guid: int) -> None:
        self.al = al
        self.ca = al.open_ca(guid)
        self.pd = self.ca.alloc_pd()
        self.cq = self.ca.create_cq(16)
        self.srq = self.pd.create_srq(SrqAttr(max_wr=4))
        self.qp = self.pd.create_qp(QpCreate(QpType.RC, self.cq, self.cq))
        self.ud = self.pd.create_qp(QpCreate(QpType.UD, self.cq, self.cq))
        self.ud.init_dgrm_svc(DgrmInfo(port_guid=self.ca.query().ports[0].port_guid))
        self.av = self.pd.create_av(AvAttr(port_num=1, dlid=2))
        self.mr = self.pd.reg_mem(bytearray(64), RW)
        self.mw = self.pd.create_mw()
        self.mcast = self.ud.attach_mcast(Gid("ff12::1"), 0xC001)
        self.pnp = al.reg_pnp(PnpClass.CA, lambda rec: None)


@pytest.fixture
def w(al: AccessLayer, ci: FakeCi) -> World:
    return World(al, ci.guid)


@pytest.fixture
def other(mgr: AlManager, ci: FakeCi) -> World:
    """The same kinds, opened through another AL instance on the same CA."""
    return World(mgr.open_al(), ci.guid)


# Every public verb of every kind, called on ``obj``; ``w`` supplies valid arguments.
VERBS: dict[str, list[Callable[[Any, World], object]]] = {
    "al": [
        lambda o, w: o.get_ca_guids(),
        lambda o, w: o.open_ca(w.ca.guid),
        lambda o, w: o.query_ca_by_guid(w.ca.guid),
        lambda o, w: o.get_ca_by_gid(Gid("fe80::1")),
        lambda o, w: o.get_port_by_gid(Gid("fe80::1")),
        lambda o, w: o.get_guid(0, "ca"),
        lambda o, w: o.reg_pnp(PnpClass.CA, lambda r: None),
        lambda o, w: o.close(),
    ],
    "ca": [
        lambda o, w: o.query(),
        lambda o, w: o.modify(1, CaMod.IS_SM, PortAttrMod()),
        lambda o, w: o.alloc_pd(),
        lambda o, w: o.create_cq(4),
        lambda o, w: o.ci_call(CiOp(1)),
        lambda o, w: o.local_mad(1, bytes(256)),
        lambda o, w: o.close(),
    ],
    "pd": [
        lambda o, w: o.create_av(AvAttr(port_num=1)),
        lambda o, w: o.create_qp(QpCreate(QpType.RC, w.cq, w.cq)),
        lambda o, w: o.create_srq(SrqAttr()),
        lambda o, w: o.reg_mem(bytearray(8), RW),
        lambda o, w: o.create_mw(),
        lambda o, w: o.dealloc(),
    ],
    "cq": [
        lambda o, w: o.poll(),
        lambda o, w: o.peek(),
        lambda o, w: o.rearm(),
        lambda o, w: o.rearm_n(1),
        lambda o, w: o.modify(32),
        lambda o, w: o.query(),
        lambda o, w: o.destroy(),
        lambda o, w: asyncio.run(o.poll_async(timeout=0.01)),
    ],
    "qp": [
        lambda o, w: o.modify(QpMod(QpState.ERROR)),
        lambda o, w: o.query(),
        lambda o, w: o.post_send(SendWr()),
        lambda o, w: o.post_recv(RecvWr()),
        lambda o, w: o.destroy(),
    ],
    "ud": [
        lambda o, w: o.init_dgrm_svc(DgrmInfo(port_guid=0)),
        lambda o, w: o.attach_mcast(Gid("ff12::2"), 0xC002),
    ],
    "srq": [
        lambda o, w: o.query(),
        lambda o, w: o.modify(SrqAttr(max_wr=8), SrqAttrMask.MAX_WR),
        lambda o, w: o.post_recv(RecvWr()),
        lambda o, w: o.destroy(),
    ],
    "av": [
        lambda o, w: o.query(),
        lambda o, w: o.modify(AvAttr(port_num=1)),
        lambda o, w: o.destroy(),
    ],
    "mr": [
        lambda o, w: o.query(),
        lambda o, w: o.rereg(MrModMask.ACCESS, access=RW),
        lambda o, w: o.reg_shared(w.pd, RW),
        lambda o, w: o.dereg(),
    ],
    "mw": [
        lambda o, w: o.query(),
        lambda o, w: o.bind(w.qp, BindWr(w.mr, w.mr.vaddr, 8, RW, o.rkey)),
        lambda o, w: o.destroy(),
    ],
    "mcast": [lambda o, w: o.detach()],
    "pnp": [lambda o, w: o.dereg()],
}
ERRORS: dict[str, type[IbError]] = {
    "al": InvalidAlHandle,
    "ca": InvalidCaHandle,
    "pd": InvalidPdHandle,
    "cq": InvalidCqHandle,
    "qp": InvalidQpHandle,
    "ud": InvalidQpHandle,
    "srq": InvalidSrqHandle,
    "av": InvalidAvHandle,
    "mr": InvalidMrHandle,
    "mw": InvalidMwHandle,
    "mcast": InvalidMcastHandle,
    "pnp": InvalidHandle,
}
DESTROY: dict[str, Callable[[Any], object]] = {
    "al": lambda o: o.close(),
    "ca": lambda o: o.close(wait=True),
    "pd": lambda o: o.dealloc(wait=True),
    "cq": lambda o: o.destroy(wait=True),
    "qp": lambda o: o.destroy(wait=True),
    "ud": lambda o: o.destroy(wait=True),
    "srq": lambda o: o.destroy(wait=True),
    "av": lambda o: o.destroy(),
    "mr": lambda o: o.dereg(),
    "mw": lambda o: o.destroy(),
    "mcast": lambda o: o.detach(),
    "pnp": lambda o: o.dereg(wait=True),
}


def _prepare_destroy(w: World, kind: str) -> None:
    """Free what would make the destroy busy (e.g. QPs on the CQ)."""
    if kind in ("cq", "srq"):
        w.qp.destroy(wait=True)
        w.ud.destroy(wait=True)


@pytest.mark.parametrize("kind", sorted(VERBS))
def test_every_verb_on_a_destroyed_handle(w: World, kind: str) -> None:
    obj = getattr(w, kind)
    _prepare_destroy(w, kind)
    DESTROY[kind](obj)
    for i, verb in enumerate(VERBS[kind]):
        with pytest.raises(ERRORS[kind]) as info:
            verb(obj, w)
        assert info.value.status is ERRORS[kind].status, f"{kind} verb {i}"


def test_destroyed_parent_invalidates_whole_subtree(w: World) -> None:
    w.ca.close(wait=True)
    for kind in ("pd", "cq", "srq", "qp", "ud", "av", "mr", "mw", "mcast"):
        with pytest.raises(ERRORS[kind]):
            VERBS[kind][0](getattr(w, kind), w)
    assert VERBS["pnp"] and w.pnp.pnp_class is PnpClass.CA  # the AL's PnP registration lives
    w.pnp.dereg()


# Handle arguments: (call taking one handle argument, the error it must raise).
ARGUMENTS: list[tuple[str, Callable[[World, Any], object], type[IbError]]] = [
    ("send_cq", lambda w, h: w.pd.create_qp(QpCreate(QpType.RC, h, w.cq)), InvalidCqHandle),
    ("recv_cq", lambda w, h: w.pd.create_qp(QpCreate(QpType.RC, w.cq, h)), InvalidCqHandle),
    ("srq", lambda w, h: w.pd.create_qp(QpCreate(QpType.RC, w.cq, w.cq, srq=h)),
     InvalidSrqHandle),
    ("spl send_cq", lambda w, h: w.pd.get_spl_qp(w.ca.query().ports[0].port_guid,
                                                  QpCreate(QpType.QP1, h, w.cq)), InvalidCqHandle),
    ("reg_shared pd", lambda w, h: w.mr.reg_shared(h, RW), InvalidPdHandle),
    ("rereg pd", lambda w, h: w.mr.rereg(MrModMask.PD, pd=h), InvalidPdHandle),
    ("bind qp", lambda w, h: w.mw.bind(h, BindWr(w.mr, w.mr.vaddr, 8, RW, w.mw.rkey)),
     InvalidQpHandle),
    ("bind mr", lambda w, h: w.mw.bind(w.qp, BindWr(h, 0, 8, RW, w.mw.rkey)), InvalidMrHandle),
    ("ud av", lambda w, h: w.ud.post_send(SendWr(ud=UdDest(h, 5, 1))), InvalidAvHandle),
    ("ci_call handle", lambda w, h: w.ca.ci_call(CiOp(1), [h]), InvalidHandle),
]


def _wrong_type(w: World, name: str) -> Any:
    return w.ca if name == "ci_call handle" else (w.cq if "pd" in name else w.pd)


@pytest.mark.parametrize("name,call,err", ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_wrong_type_argument(w: World, name: str, call: Callable[..., object],
                             err: type[IbError]) -> None:
    with pytest.raises(err) as info:
        call(w, _wrong_type(w, name))
    assert info.value.status is err.status


@pytest.mark.parametrize("name,call,err", ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_foreign_argument(w: World, other: World, name: str, call: Callable[..., object],
                          err: type[IbError]) -> None:
    attr = {"send_cq": "cq", "recv_cq": "cq", "srq": "srq", "spl send_cq": "cq",
            "reg_shared pd": "pd", "rereg pd": "pd", "bind qp": "qp", "bind mr": "mr",
            "ud av": "av", "ci_call handle": "pd"}[name]
    with pytest.raises(err) as info:
        call(w, getattr(other, attr))  # same CA, another AL instance
    assert info.value.status is err.status


@pytest.mark.parametrize("name,call,err", ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_destroyed_argument(w: World, name: str, call: Callable[..., object],
                            err: type[IbError]) -> None:
    victim: Any
    if name in ("send_cq", "recv_cq", "spl send_cq"):
        victim = w.ca.create_cq(4)
        victim.destroy(wait=True)
    elif name == "srq":
        victim = w.pd.create_srq(SrqAttr())
        victim.destroy(wait=True)
    elif name in ("reg_shared pd", "rereg pd", "ci_call handle"):
        victim = w.ca.alloc_pd()
        victim.dealloc(wait=True)
    elif name == "bind qp":
        victim = w.pd.create_qp(QpCreate(QpType.RC, w.cq, w.cq))
        victim.destroy(wait=True)
    elif name == "bind mr":
        victim = w.pd.reg_mem(bytearray(8), RW)
        victim.dereg()
    else:
        victim = w.pd.create_av(AvAttr(port_num=1))
        victim.destroy()
    with pytest.raises(err):
        call(w, victim)


def test_handles_from_another_ca_are_refused(al: AccessLayer, provider: FakeProvider) -> None:
    a = World(al, provider.cis[0].guid)
    b = World(al, provider.cis[1].guid)
    with pytest.raises(InvalidCqHandle):
        a.pd.create_qp(QpCreate(QpType.RC, b.cq, a.cq))
    with pytest.raises(InvalidPdHandle):
        a.mr.reg_shared(b.pd, RW)
    with pytest.raises(InvalidAvHandle):
        a.ud.post_send(SendWr(ud=UdDest(b.av, 5, 1)))


def test_bad_av_in_a_list_posts_the_ones_before(w: World, ci: FakeCi) -> None:
    good = SendWr(wr_id=1, ud=UdDest(w.av, 5, 1))
    bad = SendWr(wr_id=2, ud=UdDest(w.pd, 5, 1))
    with pytest.raises(InvalidAvHandle) as info:
        w.ud.post_send([good, good, bad, good])
    assert isinstance(info.value, PostError)
    assert info.value.failed_index == 2
    sent = w.ud._h.data["sent"]
    assert [wr.wr_id for wr in sent] == [1, 1]
    assert all(wr.ud.av is w.av._h for wr in sent)  # the provider saw its own handle
    assert good.ud is not None and good.ud.av is w.av  # the consumer's WR is untouched


def test_compat_wrong_type_raises_the_verbs_error(w: World) -> None:
    from ibal import compat

    cases: list[tuple[Callable[..., object], tuple[Any, ...], type[IbError]]] = [
        (compat.ib_close_al, (w.ca,), InvalidAlHandle),
        (compat.ib_open_ca, (w.pd, w.ca.guid), InvalidAlHandle),
        (compat.ib_query_ca, (w.pd,), InvalidCaHandle),
        (compat.ib_alloc_pd, (w.pd,), InvalidCaHandle),
        (compat.ib_create_cq, (w.pd, 4), InvalidCaHandle),
        (compat.ib_dealloc_pd, (w.cq,), InvalidPdHandle),
        (compat.ib_create_qp, (w.cq, QpCreate(QpType.RC, w.cq, w.cq)), InvalidPdHandle),
        (compat.ib_modify_qp, (w.pd, QpMod(QpState.ERROR)), InvalidQpHandle),
        (compat.ib_post_send, (w.cq, SendWr()), InvalidQpHandle),
        (compat.ib_post_recv, (w.cq, RecvWr()), InvalidQpHandle),
        (compat.ib_poll_cq, (w.qp,), InvalidCqHandle),
        (compat.ib_rearm_cq, (w.qp,), InvalidCqHandle),
        (compat.ib_destroy_cq, (w.qp,), InvalidCqHandle),
        (compat.ib_post_srq_recv, (w.qp, RecvWr()), InvalidSrqHandle),
        (compat.ib_query_av, (w.mr,), InvalidAvHandle),
        (compat.ib_dereg_mr, (w.mw,), InvalidMrHandle),
        (compat.ib_reg_shared, (w.mr, w.cq, RW), InvalidPdHandle),
        (compat.ib_bind_mw, (w.mr, w.qp, None), InvalidMwHandle),
        (compat.ib_bind_mw, (w.mw, w.cq, None), InvalidQpHandle),
        (compat.ib_dereg_pnp, (w.qp,), InvalidHandle),
        (compat.ib_reg_pnp, (w.ca, PnpClass.CA, lambda r: None), InvalidAlHandle),
    ]
    for fn, args, err in cases:
        with pytest.raises(err) as info:
            fn(*args)
        assert info.value.status is err.status, fn.__name__


def test_closed_manager_refuses_new_als(provider: FakeProvider) -> None:
    m = AlManager()
    m.add_provider(provider)
    m.close()
    from ibal.status import InvalidState

    with pytest.raises(InvalidState):
        m.open_al()


def test_every_handle_kind_is_an_alobject(w: World) -> None:
    from ibal.al import AlObject

    for kind in VERBS:
        assert isinstance(getattr(w, kind), AlObject), kind


_GOOD = SendWr(wr_id=1)
_BAD_SENDS: dict[str, Any] = {
    "a string": "x",
    "an int": 5,
    "None": None,
    "a dict": {"wr_id": 1},
    "a RecvWr in the list": [_GOOD, RecvWr(2)],
    "a string in the list": [_GOOD, _GOOD, "x"],
    "an Sge that is None": [_GOOD, SendWr(2, sg_list=[None])],  # type: ignore[list-item]
    "an Sge as a tuple": [SendWr(2, sg_list=[(0, 8, 1)])],  # type: ignore[list-item]
    "an sg_list that is an int": [SendWr(2, sg_list=5)],  # type: ignore[arg-type]
    "an Sge with a None addr": [_GOOD, SendWr(2, sg_list=[Sge(None, 8, 1)])],  # type: ignore[arg-type]
    "a string opcode": [SendWr(2, opcode="x")],  # type: ignore[arg-type]
    "a string wr_id": [SendWr("x")],  # type: ignore[arg-type]
    "a float remote_addr": [SendWr(2, remote_addr=1.5)],  # type: ignore[arg-type]
    "a string ud": [SendWr(2, ud="x")],  # type: ignore[arg-type]
    "a string invalidate_rkey": [SendWr(2, opcode=WrType.LOCAL_INV, invalidate_rkey="k")],  # type: ignore[arg-type]
    "a BIND_MW without bind": [_GOOD, SendWr(2, opcode=WrType.BIND_MW, mw=object())],
}


@pytest.mark.parametrize("wrs", list(_BAD_SENDS.values()), ids=list(_BAD_SENDS))
def test_malformed_send_requests_are_invalid_parameter(w: World, wrs: Any) -> None:
    """A wrong object never reaches the provider; the good requests before it are posted."""
    index = next((i for i, wr in enumerate(wrs) if wr is not _GOOD), 0) if isinstance(
        wrs, list
    ) else 0
    with pytest.raises(PostError) as info:
        w.ud.post_send(wrs)
    assert info.value.status is Status.INVALID_PARAMETER
    assert info.value.failed_index == index
    assert [wr.wr_id for wr in w.ud._h.data.get("sent", [])] == [1] * index


_BAD_RECVS: dict[str, Any] = {
    "a string": "x",
    "None": None,
    "a SendWr": [SendWr(1)],
    "an Sge that is None": [RecvWr(1), RecvWr(2, [None])],  # type: ignore[list-item]
    "an Sge with a string lkey": [RecvWr(2, [Sge(0, 8, "k")])],  # type: ignore[arg-type]
    "a string wr_id": [RecvWr("x")],  # type: ignore[arg-type]
}


@pytest.mark.parametrize("wrs", list(_BAD_RECVS.values()), ids=list(_BAD_RECVS))
@pytest.mark.parametrize("target", ["qp", "srq"])
def test_malformed_receive_requests_are_invalid_parameter(w: World, wrs: Any, target: str) -> None:
    queue = w.ud if target == "qp" else w.srq
    index = 1 if isinstance(wrs, list) and len(wrs) == 2 else 0
    with pytest.raises(PostError) as info:
        queue.post_recv(wrs)
    assert info.value.status is Status.INVALID_PARAMETER
    assert info.value.failed_index == index
    assert [wr.wr_id for wr in queue._h.data.get("recvs", [])] == [1] * index
