"""rxe's own FMR verbs between two devices over the loopback sockets: the requested
I/O address is honoured, keys change per map, scattered pages are refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from netns_util import need_root

from ibal.al import AlManager, Ca
from ibal.providers.rxe.provider import RxeProvider
from ibal.status import Unsupported
from ibal.testing.helpers import Pair, active_port, make_pair, wait_wc
from ibal.types import AccessFlags, FmrCreate, QpType, WcStatus

DEVICES = "rxe_f0=127.0.0.2,rxe_f1=127.0.0.3"
PAGE = 4096
REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


@pytest.fixture
def pair() -> Iterator[Pair]:
    need_root()
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": DEVICES}))
    try:
        al = mgr.open_al()
        cas: list[Ca] = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
        ports = [active_port(c.query().ports) for c in cas]
        assert ports[0] is not None and ports[1] is not None
        yield make_pair(cas[0], ports[0], cas[1], ports[1], QpType.RC)
    finally:
        mgr.close()


def test_map_at_requested_address_and_remap(pair: Pair) -> None:
    fmr = pair.b.pd.create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
    assert fmr.native
    buf = bytearray(4 * PAGE)
    view = memoryview(buf)
    _, first = fmr.map([view[:PAGE], view[PAGE : 2 * PAGE]], vaddr=0x1000_0000)
    assert (fmr.vaddr, fmr.length) == (0x1000_0000, 2 * PAGE)
    pair.write(b"at the iova", remote_addr=0x1000_0000 + PAGE - 4, rkey=first, wr_id=1)
    assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS
    assert bytes(buf[PAGE - 4 : PAGE + 7]) == b"at the iova"
    _, second = fmr.map([view[2 * PAGE : 3 * PAGE]], vaddr=0x1000_0000)
    assert second != first
    pair.write(b"new", remote_addr=0x1000_0000, rkey=second, wr_id=2)
    assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS
    assert bytes(buf[2 * PAGE : 2 * PAGE + 3]) == b"new"
    pair.write(b"old", remote_addr=0x1000_0000, rkey=first, wr_id=3)
    assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
    assert bytes(buf[:3]) == bytes(3)


def test_scattered_pages_unsupported(pair: Pair) -> None:
    fmr = pair.b.pd.create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
    with pytest.raises(Unsupported, match="back to back"):
        fmr.map([bytearray(PAGE), bytearray(PAGE)])
    assert not fmr.mapped
