"""Chapter: fast memory regions (the FMR extension), native or emulated by the access layer.

Every check runs on every CA: one with the FMR verbs (``Capabilities.fmr``)
answers them itself, any other gets the access layer's emulation over
register/deregister.  Page lists are carved from one buffer, so the emulation
works even on a CA without physical registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ibal.status import (
    InsufficientResources,
    InvalidFmrHandle,
    InvalidParameter,
    InvalidPermission,
    ResourceBusy,
)
from ibal.testing.helpers import wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase
from ibal.types import AccessFlags, FmrCreate, PortAttr, QpType, WcStatus

if TYPE_CHECKING:
    from ibal.al import Ca, Fmr
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Pair

PAGE = 4096
REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def pages_of(buf: bytearray, first: int, count: int) -> list[memoryview]:
    """Pages ``first .. first+count-1`` of ``buf`` (back to back in memory)."""
    view = memoryview(buf)
    return [view[i * PAGE : (i + 1) * PAGE] for i in range(first, first + count)]


class FmrChecks(ConformanceBase):
    chapter = "FMR"

    def _fmr_write(self, pair: Pair, fmr: Fmr, offset: int, data: bytes, rkey: int | None = None,
                      wr_id: int = 1) -> WcStatus:  # fmt: skip
        """A writes ``data`` into ``fmr``'s mapping (at ``offset``); the completion status."""
        pair.write(data, remote_addr=fmr.vaddr + offset,
                   rkey=fmr.rkey if rkey is None else rkey, wr_id=wr_id)  # fmt: skip
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == wr_id
        return wc.status

    @rules("ci:85", "al:62")
    def test_fmr_map_lands_across_pages(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 85 / access-layer rule 62: a map gives vaddr, lkey and rkey for
        the page list; a write across a page boundary lands in both pages."""
        pair = self.loop(ca, port, QpType.RC)
        fmr = pair.b.pd.create_fmr(FmrCreate(4, 8, PAGE, REMOTE))
        assert not fmr.mapped and fmr.rkey == 0
        buf = bytearray(4 * PAGE)
        lkey, rkey = fmr.map(pages_of(buf, 1, 2))
        assert (lkey, rkey) == (fmr.lkey, fmr.rkey) and rkey
        assert fmr.length == 2 * PAGE
        data = bytes(range(40))
        assert self._fmr_write(pair, fmr, PAGE - 20, data) is WcStatus.SUCCESS
        assert bytes(buf[2 * PAGE - 20 : 2 * PAGE + 20]) == data

    @rules("al:62", "iba:mp.dead-keys")
    def test_fmr_remap_new_keys_stale_rkey_refused(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 62: each map gives new keys; the previous mapping's R_Key is
        refused remotely (REM_ACCESS_ERR) and its pages are not touched."""
        pair = self.loop(ca, port, QpType.RC)
        fmr = pair.b.pd.create_fmr(FmrCreate(2, 8, PAGE, REMOTE))
        buf = bytearray(4 * PAGE)
        _, old = fmr.map(pages_of(buf, 0, 2))
        _, new = fmr.map(pages_of(buf, 2, 2))
        assert new != old
        assert self._fmr_write(pair, fmr, 8, b"second map") is WcStatus.SUCCESS
        assert bytes(buf[2 * PAGE + 8 : 2 * PAGE + 18]) == b"second map"
        status = self._fmr_write(pair, fmr, 8, b"stale", rkey=old, wr_id=2)
        assert status is WcStatus.REM_ACCESS_ERR
        assert bytes(buf[: 2 * PAGE]) == bytes(2 * PAGE)

    @rules("al:62", "iba:mp.dead-keys")
    def test_fmr_unmap_revokes_rkey(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 62: after an unmap the mapping's R_Key is refused remotely."""
        pair = self.loop(ca, port, QpType.RC)
        fmr = pair.b.pd.create_fmr(FmrCreate(1, 4, PAGE, REMOTE))
        buf = bytearray(PAGE)
        _, rkey = fmr.map(pages_of(buf, 0, 1))
        vaddr = fmr.vaddr
        fmr.unmap()
        assert not fmr.mapped and fmr.rkey == 0
        pair.write(b"late", remote_addr=vaddr, rkey=rkey, wr_id=3)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
        assert bytes(buf[:4]) == bytes(4)

    @rules("al:62")
    def test_fmr_max_maps_then_unmap(self, ca: Ca) -> None:
        """access-layer rule 62 / api.md: max_maps maps, then IB_INSUFFICIENT_RESOURCES until an
        unmap; the mapping in place survives the refusal."""
        fmr = ca.alloc_pd().create_fmr(FmrCreate(1, 2, PAGE, REMOTE))
        buf = bytearray(3 * PAGE)
        fmr.map(pages_of(buf, 0, 1))
        keys = fmr.map(pages_of(buf, 1, 1))
        with pytest.raises(InsufficientResources):
            fmr.map(pages_of(buf, 2, 1))
        assert (fmr.lkey, fmr.rkey) == keys and fmr.mapped
        fmr.unmap()
        fmr.map(pages_of(buf, 2, 1))
        assert fmr.mapped

    @rules("al:62")
    def test_fmr_too_many_pages_invalid_parameter(self, ca: Ca) -> None:
        """access-layer rule 62: more pages than max_pages → IB_INVALID_PARAMETER; an empty
        list too."""
        fmr = ca.alloc_pd().create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
        buf = bytearray(3 * PAGE)
        with pytest.raises(InvalidParameter):
            fmr.map(pages_of(buf, 0, 3))
        with pytest.raises(InvalidParameter):
            fmr.map([])
        assert not fmr.mapped

    @rules("al:62")
    def test_fmr_short_page_or_misaligned_vaddr_invalid_parameter(self, ca: Ca) -> None:
        """access-layer rule 62: a page shorter than page_size, or a requested address not on a
        page boundary → IB_INVALID_PARAMETER."""
        fmr = ca.alloc_pd().create_fmr(FmrCreate(2, 4, PAGE, REMOTE))
        with pytest.raises(InvalidParameter):
            fmr.map([bytearray(PAGE - 1)])
        with pytest.raises(InvalidParameter):
            fmr.map([bytearray(PAGE)], vaddr=PAGE + 8)

    @rules("ci:85", "al:62")
    def test_fmr_create_checks_limits_and_access(self, ca: Ca) -> None:
        """ci-contract rule 85 / access-layer rule 62: an unsupported page size or zero limits →
        IB_INVALID_PARAMETER; remote write without local write → IB_INVALID_PERMISSION."""
        pd = ca.alloc_pd()
        with pytest.raises(InvalidParameter):
            pd.create_fmr(FmrCreate(4, 4, 3000, REMOTE))
        with pytest.raises(InvalidParameter):
            pd.create_fmr(FmrCreate(0, 4, PAGE, REMOTE))
        with pytest.raises(InvalidPermission):
            pd.create_fmr(FmrCreate(4, 4, PAGE, AccessFlags.RDMA_WRITE))

    @rules("al:62")
    def test_fmr_destroy_mapped_resource_busy(self, ca: Ca) -> None:
        """access-layer rule 62: destroying a mapped FMR → IB_RESOURCE_BUSY; after unmap it goes,
        and the handle is then invalid."""
        fmr = ca.alloc_pd().create_fmr(FmrCreate(1, 4, PAGE, REMOTE))
        fmr.map([bytearray(PAGE)])
        with pytest.raises(ResourceBusy):
            fmr.destroy()
        fmr.unmap()
        fmr.destroy()
        with pytest.raises(InvalidFmrHandle):
            fmr.map([bytearray(PAGE)])

    @rules("al:62")
    def test_fmr_pd_dealloc_takes_mapped_fmr(self, ca: Ca) -> None:
        """access-layer rule 62 / decisions (cascade): deallocating the PD unmaps and destroys
        its FMRs."""
        pd = ca.alloc_pd()
        fmr = pd.create_fmr(FmrCreate(1, 4, PAGE, REMOTE))
        fmr.map([bytearray(PAGE)])
        pd.dealloc(wait=True)
        assert not fmr.alive
        with pytest.raises(InvalidFmrHandle):
            fmr.unmap()

    @rules("ci:85")
    def test_fmr_native_when_declared(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 85: a CA declaring fmr runs the FMR verbs itself (the access layer
        emulates them only for CAs that lack them)."""
        fmr = ca.alloc_pd().create_fmr(FmrCreate(1, 1, PAGE, REMOTE))
        assert fmr.native is bool(caps.fmr)
