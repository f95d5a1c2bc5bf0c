"""The access layer over the real mock provider (skipped until it is installed)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import ibal
from ibal.al import AlManager, Cq, PnpClass, PnpEvent, PnpRec, QpCreate
from ibal.status import InvalidCaHandle, InvalidGuid
from ibal.types import AccessFlags, DgrmInfo, QpType, RecvWr, SendWr, UdDest

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

WAIT = 10.0


def test_demo_over_the_mock_fabric() -> None:
    from ibal.demo import run_demo

    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        report = run_demo(al)
        assert report.ok, [(s.name, s.check) for s in report.steps if not s.ok]


def test_ud_loopback_with_completion_callbacks() -> None:
    with ibal.open_al(providers={"mock": {"cas": 1}}) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        port = next(p for p in ca.query().ports if p.link_state.name == "ACTIVE")
        pd = ca.alloc_pd()
        got = threading.Event()
        threads: list[int] = []

        def comp(cq: Cq, ctx: Any) -> None:
            threads.append(threading.get_ident())
            got.set()

        cq = ca.create_cq(16, comp_cb=comp)
        qp = pd.create_qp(QpCreate(QpType.UD, cq, cq))
        qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=0x42))
        buf = bytearray(256)
        mr = pd.reg_mem(buf, AccessFlags.LOCAL_WRITE)
        from ibal.testing.helpers import av_to

        av = pd.create_av(av_to(port, port.port_num))
        qp.post_recv(RecvWr(wr_id=1, sg_list=[mr.sge(128, 128)]))
        buf[:5] = b"hello"
        cq.rearm()
        qp.post_send(SendWr(wr_id=2, sg_list=[mr.sge(0, 5)],
                            ud=UdDest(av=av, remote_qp=qp.num, remote_qkey=0x42)))
        assert got.wait(WAIT)
        assert threads and threads[0] != threading.get_ident()
        wcs = []
        while len(wcs) < 2:
            wcs += cq.poll()
        assert bytes(buf[128 + 40:128 + 45]) == b"hello"


def test_provider_stop_tears_down_through_the_mock(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ibal.al")
    mgr = AlManager()
    mgr.start_provider("mock", {"cas": 1})
    al = mgr.open_al()
    guid = al.get_ca_guids()[0]
    ca = al.open_ca(guid)
    pd = ca.alloc_pd()
    cq = ca.create_cq(8)
    pd.create_qp(QpCreate(QpType.RC, cq, cq))
    pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
    removed: list[PnpEvent] = []

    def cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_REMOVE:
            removed.append(rec.event)

    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, cb)
    mgr.deregister_ca(guid)  # the mock's close_ca refuses if anything was left behind
    assert removed == [PnpEvent.CA_REMOVE]
    with pytest.raises(InvalidCaHandle):
        ca.query()
    with pytest.raises(InvalidGuid):
        al.open_ca(guid)
    mgr.close()
    problems = [r.getMessage() for r in caplog.records if "close_ca" in r.getMessage()
                or "cleanup" in r.getMessage()]
    assert not problems  # every destroy verb and close_ca succeeded at the mock


@pytest.mark.parametrize(
    ("gid", "roce", "expected"),
    [
        ("ff12:401b::1", False, True),
        ("ff12:401b::1", True, True),
        ("::ffff:239.1.2.3", True, True),  # RoCE v2 over IPv4: IPv4-mapped group
        ("::ffff:239.1.2.3", False, False),  # not an IB multicast GID
        ("::ffff:10.0.0.1", True, False),
        ("fe80::1", True, False),
    ],
)
def test_multicast_gid_forms(gid: str, roce: bool, expected: bool) -> None:
    from ibal.al.qp import _is_multicast_gid
    from ibal.types import Gid

    assert _is_multicast_gid(Gid(gid), roce=roce) is expected


def test_ib_port_refuses_ipv4_mapped_group() -> None:
    from ibal.status import InvalidGid

    with ibal.open_al(providers={"mock": {"cas": 1}}) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        port = next(p for p in ca.query().ports if p.link_state.name == "ACTIVE")
        pd = ca.alloc_pd()
        cq = ca.create_cq(16)
        qp = pd.create_qp(QpCreate(QpType.UD, cq, cq))
        qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=0x42))
        with pytest.raises(InvalidGid):
            qp.attach_mcast("::ffff:239.1.2.3", 0xC001)
        m = qp.attach_mcast("ff12:401b::1", 0xC001)
        m.detach()
