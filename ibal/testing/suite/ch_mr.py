"""Chapter: memory regions (virtual, physical, shared, re-registration)."""

from __future__ import annotations

import ctypes
import mmap
import uuid
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, cast

import pytest

from ibal.status import (
    InvalidMrHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPermission,
    InvalidSetting,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.helpers import wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require, require_opcode
from ibal.types import (
    AccessFlags,
    MrModMask,
    PhysCreate,
    PortAttr,
    QpType,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Mr
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Pair

LW = AccessFlags.LOCAL_WRITE
REMOTE = LW | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def address_of(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class MrChecks(ConformanceBase):
    chapter = "MR"

    def _writer(self, ca: Ca, port: PortAttr) -> Pair:
        return self.loop(ca, port, QpType.RC)

    def _write_status(
        self, pair: Pair, mr: Mr, offset: int, data: bytes, wr_id: int = 1
    ) -> WcStatus:
        """A writes ``data`` into ``mr`` (at ``offset``) through B; the completion status."""
        pair.write(data, remote_addr=mr.vaddr + offset, rkey=mr.rkey, wr_id=wr_id)
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == wr_id
        return wc.status

    # ---------------------------------------------------------- virtual
    @rules("ci:74")
    def test_reg_mem_reports_keys_and_bounds(self, ca: Ca) -> None:
        """decisions (reg_mem) / ci-contract rule 74: vaddr is the buffer's address, length its
        size."""
        buf = bytearray(3000)
        mr = ca.alloc_pd().reg_mem(buf, REMOTE)
        assert mr.vaddr == address_of(buf)
        assert mr.length == 3000
        assert 0 <= mr.lkey < 1 << 32 and 0 <= mr.rkey < 1 << 32

    @rules("ci:78", "al:58")
    def test_query_mr_matches_registration(self, ca: Ca) -> None:
        """ci-contract rule 78 / access-layer rule 58: query gives PD, bounds, access and keys."""
        pd = ca.alloc_pd()
        buf = bytearray(1024)
        mr = pd.reg_mem(buf, REMOTE)
        a = mr.query()
        assert a.pd is pd
        assert (a.lkey, a.rkey, a.access) == (mr.lkey, mr.rkey, REMOTE)
        assert a.local_lb == mr.vaddr and a.local_ub in (mr.vaddr + 1023, mr.vaddr + 1024)
        assert a.remote_lb == a.local_lb and a.remote_ub == a.local_ub

    @pytest.mark.parametrize(
        "right", [AccessFlags.RDMA_WRITE, AccessFlags.ATOMIC], ids=lambda f: f.name
    )
    @rules("ci:75", "al:52")
    def test_remote_right_without_local_write_refused(
        self, ca: Ca, caps: Capabilities, right: AccessFlags
    ) -> None:
        """ci-contract rule 75 / access-layer rule 52: remote write or atomic needs local write →
        IB_INVALID_PERMISSION."""
        if right is AccessFlags.ATOMIC:
            require(caps, "atomics")
        with pytest.raises(InvalidPermission):
            ca.alloc_pd().reg_mem(bytearray(64), right | AccessFlags.RDMA_READ)

    @rules("ci:74")
    def test_regions_get_distinct_keys(self, ca: Ca) -> None:
        """ci-contract rule 74: every registration has its own L_Key and R_Key."""
        pd = ca.alloc_pd()
        mrs = [pd.reg_mem(bytearray(64), REMOTE) for _ in range(4)]
        assert len({m.lkey for m in mrs}) == 4 and len({m.rkey for m in mrs}) == 4

    @rules("ci:78", "al:56")
    def test_dereg_then_use_raises_invalid_mr_handle(self, ca: Ca) -> None:
        """ci-contract rule 78 / access-layer rule 56: a deregistered MR → IB_INVALID_MR_HANDLE."""
        mr = ca.alloc_pd().reg_mem(bytearray(64), LW)
        mr.dereg()
        with pytest.raises(InvalidMrHandle):
            mr.query()
        with pytest.raises(InvalidMrHandle):
            mr.dereg()

    @rules("doc:api.md")
    def test_mr_sge_addresses_region(self, ca: Ca) -> None:
        """api.md: mr.sge(offset, length) is an SGE at vaddr + offset with the region's L_Key."""
        mr = ca.alloc_pd().reg_mem(bytearray(512), LW)
        s = mr.sge(100, 20)
        assert (s.addr, s.length, s.lkey) == (mr.vaddr + 100, 20, mr.lkey)
        whole = mr.sge()
        assert (whole.addr, whole.length) == (mr.vaddr, 512)

    @rules("doc:decisions")
    def test_memoryview_slice_registers_that_slice(self, ca: Ca, port: PortAttr) -> None:
        """decisions (reg_mem): any writable buffer registers; a slice's bytes land in the
        parent."""
        pair = self._writer(ca, port)
        parent = bytearray(2048)
        mr = pair.b.pd.reg_mem(memoryview(parent)[512:1536], REMOTE)
        assert mr.vaddr == address_of(parent) + 512 and mr.length == 1024
        assert self._write_status(pair, mr, 8, b"into the slice") is WcStatus.SUCCESS
        assert bytes(parent[520:534]) == b"into the slice"
        assert parent[:512] == bytes(512)

    @rules("doc:decisions")
    def test_mmap_buffer_registers(self, ca: Ca, port: PortAttr) -> None:
        """decisions (reg_mem): an anonymous mmap registers and receives RDMA writes."""
        pair = self._writer(ca, port)
        region = mmap.mmap(-1, 4096)
        try:
            mr = pair.b.pd.reg_mem(region, REMOTE)
            assert self._write_status(pair, mr, 4000, b"mmapped!") is WcStatus.SUCCESS
            assert region[4000:4008] == b"mmapped!"
            mr.dereg()
        finally:
            region.close()

    # ---------------------------------------------------------- re-registration
    @rules("ci:8")
    def test_rereg_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8: re-registration is optional; without it ib_rereg_mem →
        IB_UNSUPPORTED."""
        mr = ca.alloc_pd().reg_mem(bytearray(64), LW)
        if caps.modify_mr:
            mr.rereg(MrModMask.ACCESS, access=REMOTE)
            assert mr.query().access == REMOTE
            return
        with pytest.raises(Unsupported):
            mr.rereg(MrModMask.ACCESS, access=REMOTE)

    @rules("ci:80", "al:57", "iba:mp.dead-keys")
    def test_rereg_access_revokes_remote_write(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 57 / ci-contract rule 80: new access applies; the object carries the
        new keys."""
        require(caps, "modify_mr")
        pair = self._writer(ca, port)
        buf = bytearray(256)
        mr = pair.b.pd.reg_mem(buf, REMOTE)
        assert self._write_status(pair, mr, 0, b"before", 1) is WcStatus.SUCCESS
        mr.rereg(MrModMask.ACCESS, access=LW | AccessFlags.RDMA_READ)
        a = mr.query()
        assert a.access == LW | AccessFlags.RDMA_READ
        assert (a.lkey, a.rkey) == (mr.lkey, mr.rkey)
        assert self._write_status(pair, mr, 16, b"after", 2) is WcStatus.REM_ACCESS_ERR
        assert bytes(buf[16:21]) == bytes(5)

    @rules("al:57")
    def test_rereg_access_grants_remote_read(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 57: a right added by re-registration is usable with the new R_Key."""
        require(caps, "modify_mr")
        require_opcode(caps, QpType.RC, WrType.RDMA_READ)
        pair = self._writer(ca, port)
        buf = bytearray(b"readable now" + bytes(52))
        mr = pair.b.pd.reg_mem(buf, LW)
        mr.rereg(MrModMask.ACCESS, access=LW | AccessFlags.RDMA_READ)
        pair.read(12, remote_addr=mr.vaddr, rkey=mr.rkey, dst_off=900, wr_id=5)
        wc = wait_wc(pair.a.cq)
        assert wc.status is WcStatus.SUCCESS and pair.a.get(900, 12) == b"readable now"

    @rules("ci:80")
    def test_rereg_pd_moves_region(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 80: mask PD only moves the MR to the new PD with new keys."""
        require(caps, "modify_mr")
        old_pair, new_pair = self._writer(ca, port), self._writer(ca, port)
        buf = bytearray(256)
        mr = old_pair.b.pd.reg_mem(buf, REMOTE)
        mr.rereg(MrModMask.PD, pd=new_pair.b.pd)
        assert mr.query().pd is new_pair.b.pd
        assert self._write_status(new_pair, mr, 0, b"new home", 1) is WcStatus.SUCCESS
        assert bytes(buf[:8]) == b"new home"
        assert self._write_status(old_pair, mr, 32, b"old pd", 2) is WcStatus.REM_ACCESS_ERR

    @rules("al:57")
    def test_rereg_addr_moves_to_new_buffer(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 57: mask ADDR re-registers over a new buffer; writes land there
        only."""
        require(caps, "modify_mr")
        pair = self._writer(ca, port)
        old, new = bytearray(128), bytearray(512)
        mr = pair.b.pd.reg_mem(old, REMOTE)
        mr.rereg(MrModMask.ADDR, buffer=new)
        assert (mr.vaddr, mr.length) == (address_of(new), 512)
        assert self._write_status(pair, mr, 300, b"moved") is WcStatus.SUCCESS
        assert bytes(new[300:305]) == b"moved" and old == bytearray(128)

    @rules("ci:81", "al:57")
    def test_rereg_bad_mask_raises_invalid_parameter(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 81 / access-layer rule 57: an empty or unknown mask →
        IB_INVALID_PARAMETER; MR unchanged."""
        require(caps, "modify_mr")
        mr = ca.alloc_pd().reg_mem(bytearray(64), LW)
        keys = (mr.lkey, mr.rkey)
        with pytest.raises(InvalidParameter):
            mr.rereg(MrModMask(0), access=REMOTE)
        with pytest.raises(InvalidParameter):
            mr.rereg(cast(MrModMask, 0x40), access=REMOTE)
        assert (mr.lkey, mr.rkey) == keys and mr.query().access == LW

    @rules("ci:81")
    def test_rereg_to_freed_pd_raises_invalid_pd_handle(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 81: mask PD with a bad PD → IB_INVALID_PD_HANDLE; MR still valid."""
        require(caps, "modify_mr")
        pd = ca.alloc_pd()
        mr = pd.reg_mem(bytearray(64), LW)
        gone = ca.alloc_pd()
        gone.dealloc(wait=True)
        with pytest.raises(InvalidPdHandle):
            mr.rereg(MrModMask.PD, pd=gone)
        assert mr.query().pd is pd

    @rules("ci:75")
    def test_rereg_remote_without_local_write_refused(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 75: re-registration to remote write without local write →
        IB_INVALID_PERMISSION."""
        require(caps, "modify_mr")
        mr = ca.alloc_pd().reg_mem(bytearray(64), LW)
        with pytest.raises(InvalidPermission):
            mr.rereg(MrModMask.ACCESS, access=AccessFlags.RDMA_WRITE)
        assert mr.query().access == LW

    # ---------------------------------------------------------- physical
    @rules("ci:77", "al:53")
    def test_reg_phys_pages_look_contiguous(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 77 / access-layer rule 53: pages form one region at the assigned
        vaddr."""
        require(caps, "phys_mr")
        pair = self._writer(ca, port)
        pages = [bytearray(4096), bytearray(4096)]
        mr = pair.b.pd.reg_phys(PhysCreate([memoryview(p) for p in pages], 4096, 8192, REMOTE))
        assert mr.length == 8192
        data = bytes(range(32))
        assert self._write_status(pair, mr, 4096 - 16, data) is WcStatus.SUCCESS
        assert bytes(pages[0][-16:]) == data[:16] and bytes(pages[1][:16]) == data[16:]

    @rules("al:53")
    def test_reg_phys_buf_offset(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """access-layer rule 53: buf_offset says where in the first page the region starts."""
        require(caps, "phys_mr")
        pair = self._writer(ca, port)
        page = bytearray(4096)
        mr = pair.b.pd.reg_phys(PhysCreate([memoryview(page)], 4096, 1000, REMOTE, buf_offset=100))
        assert self._write_status(pair, mr, 0, b"offset") is WcStatus.SUCCESS
        assert bytes(page[100:106]) == b"offset"

    @rules("ci:76")
    def test_reg_phys_bad_page_size_raises_invalid_parameter(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 76: an unsupported page size → IB_INVALID_PARAMETER."""
        require(caps, "phys_mr")
        with pytest.raises(InvalidParameter):
            ca.alloc_pd().reg_phys(PhysCreate([memoryview(bytearray(3000))], 3000, 3000, LW))

    @rules("ci:76")
    def test_reg_phys_length_beyond_pages_raises_invalid_parameter(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 76: a length the pages cannot hold → IB_INVALID_PARAMETER."""
        require(caps, "phys_mr")
        with pytest.raises(InvalidParameter):
            ca.alloc_pd().reg_phys(PhysCreate([memoryview(bytearray(4096))], 4096, 8192, LW))

    @rules("ci:75")
    def test_reg_phys_remote_without_local_write_refused(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 75: physical remote write without local write →
        IB_INVALID_PERMISSION."""
        require(caps, "phys_mr")
        with pytest.raises(InvalidPermission):
            ca.alloc_pd().reg_phys(
                PhysCreate([memoryview(bytearray(4096))], 4096, 4096, AccessFlags.RDMA_WRITE)
            )

    @rules("ci:78")
    def test_reg_phys_query_matches(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 78: query of a physical region reports its bounds, access and keys."""
        require(caps, "phys_mr")
        pd = ca.alloc_pd()
        mr = pd.reg_phys(PhysCreate([memoryview(bytearray(4096))], 4096, 4096, REMOTE))
        a = mr.query()
        assert (a.pd, a.lkey, a.rkey, a.access) == (pd, mr.lkey, mr.rkey, REMOTE)
        assert a.local_lb == mr.vaddr

    @rules("ci:8")
    def test_reg_phys_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8: a CA without physical registration → IB_UNSUPPORTED."""
        create = PhysCreate([memoryview(bytearray(4096))], 4096, 4096, LW)
        if caps.phys_mr:
            assert ca.alloc_pd().reg_phys(create).length == 4096
            return
        with pytest.raises(Unsupported):
            ca.alloc_pd().reg_phys(create)

    @rules("ci:77", "al:57")
    def test_rereg_phys_moves_region_to_pages(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 57 / ci-contract rule 77: ib_rereg_phys of a virtual region onto
        pages gives new keys; writes land in the pages, the old R_Key is refused."""
        require(caps, "phys_mr")
        pair = self._writer(ca, port)
        old_buf = bytearray(256)
        mr = pair.b.pd.reg_mem(old_buf, REMOTE)
        old_rkey, old_vaddr = mr.rkey, mr.vaddr
        pages = [bytearray(4096), bytearray(4096)]
        mr.rereg_phys(MrModMask.ADDR, PhysCreate([memoryview(p) for p in pages], 4096, 8192,
                                                 REMOTE))  # fmt: skip
        assert mr.rkey != old_rkey and mr.length == 8192 and mr.buffer is None
        assert self._write_status(pair, mr, 4090, b"straddles") is WcStatus.SUCCESS
        assert bytes(pages[0][4090:]) + bytes(pages[1][:3]) == b"straddles"
        pair.write(b"stale", remote_addr=old_vaddr, rkey=old_rkey, wr_id=9)
        assert wait_wc(pair.a.cq).status is WcStatus.REM_ACCESS_ERR
        assert old_buf == bytearray(256)

    @rules("al:57")
    def test_rereg_phys_access_and_pd(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 57: ACCESS takes the PhysCreate's rights, PD alone needs no
        PhysCreate; each gives new keys."""
        require(caps, "phys_mr")
        pd, other = ca.alloc_pd(), ca.alloc_pd()
        create = PhysCreate([memoryview(bytearray(4096))], 4096, 4096, LW)
        mr = pd.reg_phys(create)
        lkey = mr.lkey
        mr.rereg_phys(MrModMask.ACCESS, PhysCreate(create.pages, 4096, 4096, REMOTE))
        assert mr.query().access == REMOTE and mr.lkey != lkey
        mr.rereg_phys(MrModMask.PD, pd=other)
        assert mr.query().pd is other and mr.pd is other

    @rules("ci:75", "ci:76", "al:57")
    def test_rereg_phys_bad_arguments(self, ca: Ca, caps: Capabilities) -> None:
        """access-layer rule 57 / ci-contract rule 75, 76: a bad mask or a missing PhysCreate →
        IB_INVALID_PARAMETER, a bad page size too; remote write without local write →
        IB_INVALID_PERMISSION; the region is unchanged."""
        require(caps, "phys_mr")
        pd = ca.alloc_pd()
        mr = pd.reg_phys(PhysCreate([memoryview(bytearray(4096))], 4096, 4096, LW))
        keys = (mr.lkey, mr.rkey, mr.vaddr)
        with pytest.raises(InvalidParameter):
            mr.rereg_phys(MrModMask(0x10), PhysCreate([memoryview(bytearray(4096))], 4096, 4096,
                                                      LW))  # fmt: skip
        with pytest.raises(InvalidParameter):
            mr.rereg_phys(MrModMask.ADDR)
        with pytest.raises(InvalidParameter):
            mr.rereg_phys(MrModMask.ADDR, PhysCreate([memoryview(bytearray(3000))], 3000, 3000, LW))
        with pytest.raises(InvalidPermission):
            mr.rereg_phys(MrModMask.ACCESS, PhysCreate([memoryview(bytearray(4096))], 4096, 4096,
                                                       AccessFlags.RDMA_WRITE))  # fmt: skip
        assert (mr.lkey, mr.rkey, mr.vaddr) == keys and mr.query().lkey == keys[0]

    @rules("ci:8")
    def test_rereg_phys_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8: a CA without physical registration → IB_UNSUPPORTED for
        ib_rereg_phys."""
        mr = ca.alloc_pd().reg_mem(bytearray(64), LW)
        create = PhysCreate([memoryview(bytearray(4096))], 4096, 4096, LW)
        if caps.phys_mr:
            mr.rereg_phys(MrModMask.ADDR, create)
            assert mr.length == 4096
            return
        with pytest.raises(Unsupported):
            mr.rereg_phys(MrModMask.ADDR, create)

    # ---------------------------------------------------------- shared memory (shmid)
    @rules("al:55")
    def test_reg_shmid_registrations_share_pages(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 55: two registrations of one shmid (a POSIX shared-memory
        segment, mapped twice) reach the same pages: a write through one is read through the
        other; another length → IB_INVALID_SETTING."""
        pair = self._writer(ca, port)
        seg = shared_memory.SharedMemory(name=f"ibal-{uuid.uuid4().hex[:16]}", create=True,
                                         size=8192)  # fmt: skip
        try:
            first = pair.b.pd.reg_shmid(seg.name, REMOTE)
            second = ca.alloc_pd().reg_shmid(seg.name, LW, length=8192)
            assert first.length == second.length == 8192 and first.vaddr != second.vaddr
            assert self._write_status(pair, first, 5000, b"one segment") is WcStatus.SUCCESS
            assert second.buffer is not None
            assert bytes(second.buffer[5000:5011]) == b"one segment"
            with pytest.raises(InvalidSetting):
                ca.alloc_pd().reg_shmid(seg.name, LW, length=4096)
            first.dereg()
            second.dereg()
        finally:
            seg.close()
            seg.unlink()

    # ---------------------------------------------------------- shared
    @rules("ci:82", "al:54")
    def test_reg_shared_writes_reach_same_pages(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 82 / access-layer rule 54: a shared MR has its own keys over the same
        pages."""
        require(caps, "shared_mr")
        pair = self._writer(ca, port)
        buf = bytearray(512)
        mr = pair.b.pd.reg_mem(buf, REMOTE)
        shared = mr.reg_shared(pair.b.pd, REMOTE)
        assert shared.lkey != mr.lkey and shared.rkey != mr.rkey
        assert shared.length == mr.length
        assert self._write_status(pair, shared, 40, b"via shared") is WcStatus.SUCCESS
        assert bytes(buf[40:50]) == b"via shared"

    @rules("ci:83", "al:54")
    def test_dereg_original_with_shared_raises_resource_busy(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 83 / access-layer rule 54: dereg of a region with a shared MR →
        IB_RESOURCE_BUSY."""
        require(caps, "shared_mr")
        pd = ca.alloc_pd()
        mr = pd.reg_mem(bytearray(128), REMOTE)
        shared = mr.reg_shared(pd, REMOTE)
        with pytest.raises(ResourceBusy):
            mr.dereg()
        assert mr.query().lkey == mr.lkey
        shared.dereg()
        mr.dereg()

    @rules("ci:82")
    def test_reg_shared_from_deregistered_raises_invalid_mr_handle(
        self, ca: Ca, caps: Capabilities
    ) -> None:
        """ci-contract rule 82: sharing a deregistered region → IB_INVALID_MR_HANDLE."""
        require(caps, "shared_mr")
        pd = ca.alloc_pd()
        mr = pd.reg_mem(bytearray(64), LW)
        mr.dereg()
        with pytest.raises(InvalidMrHandle):
            mr.reg_shared(pd, LW)

    @rules("al:54")
    def test_reg_shared_into_other_pd(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """access-layer rule 54: a shared MR may live in another PD and serves that PD's QPs."""
        require(caps, "shared_mr")
        first, second = self._writer(ca, port), self._writer(ca, port)
        buf = bytearray(256)
        mr = first.b.pd.reg_mem(buf, REMOTE)
        shared = mr.reg_shared(second.b.pd, REMOTE)
        assert shared.query().pd is second.b.pd
        assert self._write_status(second, shared, 0, b"pd two") is WcStatus.SUCCESS
        assert bytes(buf[:6]) == b"pd two"

    @rules("ci:8")
    def test_reg_shared_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8: a CA without shared regions → IB_UNSUPPORTED."""
        pd = ca.alloc_pd()
        mr = pd.reg_mem(bytearray(64), LW)
        if caps.shared_mr:
            assert mr.reg_shared(pd, LW).length == 64
            return
        with pytest.raises(Unsupported):
            mr.reg_shared(pd, LW)
