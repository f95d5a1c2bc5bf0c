"""``ib_rereg_phys`` through the access layer over the mock (its ``modify_pmr``): what
changes, what is refused, and that a refusal leaves the region as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ibal
from ibal import compat as c
from ibal.al import AccessLayer, Ca
from ibal.status import InvalidMrHandle, InvalidParameter, InvalidPdHandle, ResourceBusy
from ibal.testing.helpers import active_port, make_pair, wait_wc
from ibal.types import AccessFlags, BindWr, MrModMask, PhysCreate, QpType, WcStatus

PAGE = 4096
LW = AccessFlags.LOCAL_WRITE
REMOTE = LW | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    with ibal.open_al(providers={"mock": {"cas": 1}}) as opened:
        yield opened


@pytest.fixture
def ca(al: AccessLayer) -> Ca:
    return al.open_ca(al.get_ca_guids()[0])


def phys(n: int = 1, access: AccessFlags = REMOTE, offset: int = 0,
         length: int | None = None) -> PhysCreate:  # fmt: skip
    pages = [memoryview(bytearray(PAGE)) for _ in range(n)]
    return PhysCreate(pages, PAGE, n * PAGE - offset if length is None else length, access,
                      buf_offset=offset)  # fmt: skip


def test_requested_address_kept_when_the_offset_matches(ca: Ca) -> None:
    pd = ca.alloc_pd()
    mr = pd.reg_mem(bytearray(100), LW)
    mr.rereg_phys(MrModMask.ADDR, phys(2, offset=16, length=1000), vaddr=0x5000_0010)
    assert (mr.vaddr, mr.length, mr.buffer) == (0x5000_0010, 1000, None)
    a = mr.query()
    assert (a.local_lb, a.lkey) == (0x5000_0010, mr.lkey)


def test_windows_bound_make_it_busy(ca: Ca) -> None:
    port = active_port(ca.query().ports)
    assert port is not None
    pair = make_pair(ca, port, ca, port, QpType.RC)
    create = phys(1, REMOTE | AccessFlags.MW_BIND)
    mr = pair.b.pd.reg_phys(create)
    mw = pair.b.pd.create_mw()
    mw.bind(pair.b.qp, BindWr(mr, mr.vaddr, 64, AccessFlags.RDMA_WRITE, mw.rkey, wr_id=5))
    keys = (mr.lkey, mr.rkey)
    with pytest.raises(ResourceBusy):
        mr.rereg_phys(MrModMask.ADDR, phys(1))
    assert (mr.lkey, mr.rkey) == keys
    # still the same region: a write through the window lands in the old page
    pair.write(b"still", remote_addr=mr.vaddr, rkey=mw.rkey, wr_id=6)
    assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS
    assert bytes(create.pages[0][:5]) == b"still"


def test_shared_regions_make_it_busy(ca: Ca) -> None:
    pd = ca.alloc_pd()
    mr = pd.reg_phys(phys(1))
    shared = mr.reg_shared(pd, REMOTE)
    with pytest.raises(ResourceBusy):
        mr.rereg_phys(MrModMask.ACCESS, phys(1, LW))
    shared.dereg()
    mr.rereg_phys(MrModMask.ACCESS, phys(1, LW))
    assert mr.access == LW and mr.rkey == 0


def test_handles_are_checked(ca: Ca, al: AccessLayer) -> None:
    pd = ca.alloc_pd()
    mr = pd.reg_phys(phys(1))
    dead = ca.alloc_pd()
    dead.dealloc(wait=True)
    with pytest.raises(InvalidPdHandle):
        mr.rereg_phys(MrModMask.PD, pd=dead)
    with pytest.raises(InvalidParameter):  # PD in the mask, no PD given
        mr.rereg_phys(MrModMask.PD)
    with pytest.raises(InvalidParameter):  # a PhysCreate the mask does not name
        mr.rereg_phys(MrModMask.PD, phys(1), pd=pd)
    with pytest.raises(InvalidParameter):
        mr.rereg_phys(MrModMask.ADDR, "pages")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        mr.rereg_phys(MrModMask.ADDR, phys(1), vaddr=-1)
    mr.dereg()
    with pytest.raises(InvalidMrHandle):
        mr.rereg_phys(MrModMask.ADDR, phys(1))


def test_compat_spelling_and_move_to_another_pd(ca: Ca) -> None:
    pd, other = ca.alloc_pd(), ca.alloc_pd()
    mr = c.ib_reg_mem(pd, bytearray(64), LW)
    old = mr.lkey
    c.ib_rereg_phys(mr, MrModMask.ADDR | MrModMask.PD, phys(1, LW), 0, other)
    assert mr.pd is other and mr.lkey != old and mr.length == PAGE
    pd.dealloc(wait=True)  # the region went with its new PD's bookkeeping, not the old one's
    assert mr.alive
    other.dealloc(wait=True)
    assert not mr.alive
