"""Chapter: edges, generated.

Memory, key and atomic checks whose operands hypothesis draws: offsets and
lengths around both ends of a region or window (the first and last byte, one
before, one after, spans across either end), 64-bit atomic operands with their
high bits set, R_Keys one bit away from a live one, and accesses through a key
after the event that killed it (deregister, re-register, rebind, unbind,
destroy).  Every drawn case knows its answer: inside the range the bytes land
exactly and nothing else changes; outside it the request fails and no byte of
the buffer (guard bytes either side of the region included) changes.

The explicit examples always run; hypothesis adds a bounded, derandomized
number of drawn cases (:data:`EXAMPLES`), so the chapter is as fast and as
repeatable as the rest of the suite.  Each check runs from the loopback peer
and from a second CA (the ``peer`` fixture).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from ibal.testing.helpers import Pair, atomic_result_ok, wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, deviation, require, require_opcode
from ibal.testing.suite.ch_errors import PEER_TIMING, assert_local_error
from ibal.types import (
    AccessFlags,
    BindWr,
    MrModMask,
    PortAttr,
    QpType,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Mr, Mw

GUARD = 64
"""Bytes either side of a probed region, in the same buffer: a provider that ignores the
region's bounds writes them."""
REGION = 256
EXAMPLES = 12
"""Drawn cases per check and peer, beside the explicit edges."""

EDGES = settings(
    max_examples=EXAMPLES,
    deadline=None,  # never a timing assertion
    derandomize=True,  # the same cases every run
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow],
)

_RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def spans(n: int) -> st.SearchStrategy[tuple[int, int]]:
    """(offset, length) pairs around a range of ``n`` bytes, inside and across its ends."""
    near = st.sampled_from([-9, -8, -2, -1, 0, 1, n - 2, n - 1, n, n + 1, n + 8])
    return st.one_of(
        st.tuples(near, st.sampled_from([1, 2, 7, 8, 9])),
        st.tuples(st.integers(-GUARD, n + GUARD // 2), st.integers(1, 64)),
        st.tuples(st.sampled_from([-1, 0, 1]), st.sampled_from([n - 1, n, n + 1])),
    )


def inside(off: int, length: int, n: int) -> bool:
    return off >= 0 and off + length <= n


U64 = st.one_of(
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
    st.integers(2**63, 2**64 - 1),
)
"""64-bit operands: the ends, the 32-bit seam, the sign bit, anything with the top bit set."""


@dataclass
class Rig:
    """A connected RC pair and, on B, a region of :data:`REGION` bytes inside a buffer with
    :data:`GUARD` bytes either side."""

    pair: Pair
    buf: bytearray
    mr: Mr

    @property
    def region(self) -> bytes:
        return bytes(self.buf[GUARD : GUARD + REGION])

    def remote(self, off: int) -> int:
        return self.mr.vaddr + off


class Rigs:
    """Hands out a live :class:`Rig`, building a fresh one after a request failed (a failed
    RC request takes the QP to ERROR)."""

    def __init__(self, make: Callable[[], Rig]) -> None:
        self._make = make
        self._rig: Rig | None = None

    def get(self) -> Rig:
        if self._rig is None:
            self._rig = self._make()
        return self._rig

    def failed(self) -> None:
        self._rig = None


class EdgeChecks(ConformanceBase):
    chapter = "generated edges"

    def _edge_rigs(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr], access: AccessFlags = _RW
    ) -> Rigs:
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_WRITE)

        def make() -> Rig:
            pair = self.pair(ca, port, peer, QpType.RC, timing=PEER_TIMING)
            buf = bytearray(GUARD * 2 + REGION)
            mr = pair.b.pd.reg_mem(memoryview(buf)[GUARD : GUARD + REGION], access)
            return Rig(pair, buf, mr)

        return Rigs(make)

    @staticmethod
    def _edge_status(rig: Rig, wr: SendWr) -> WcStatus:
        rig.pair.a.qp.post_send(wr)
        wc = wait_wc(rig.pair.a.cq)
        assert wc.wr_id == wr.wr_id, f"completion for WR {wc.wr_id}, posted {wr.wr_id}"
        return wc.status

    def _edge_write(self, rigs: Rigs, rig: Rig, addr: int, data: bytes, rkey: int) -> WcStatus:
        """RDMA WRITE ``data`` from A to ``addr``/``rkey``; a failure retires the rig."""
        rig.pair.a.put(0, data)
        status = self._edge_status(rig, SendWr(wr_id=11, opcode=WrType.RDMA_WRITE,
                                          sg_list=[rig.pair.a.sge(0, len(data))],
                                          remote_addr=addr, rkey=rkey))  # fmt: skip
        if status is not WcStatus.SUCCESS:
            rigs.failed()
        return status

    # --------------------------------------------------------------- regions
    @rules("iba:mp.remote-bounds", "iba:mp.untouched", "ci:74")
    def test_rdma_write_at_region_edges(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: an RDMA WRITE inside a region lands exactly; one starting before its
        first byte or ending after its last → REM_ACCESS_ERR and the buffer is unchanged."""
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(span=spans(REGION), seed=st.integers(1, 255))
        @example(span=(0, 1), seed=1)
        @example(span=(REGION - 1, 1), seed=2)
        @example(span=(0, REGION), seed=3)
        @example(span=(-1, 1), seed=4)
        @example(span=(REGION, 1), seed=5)
        @example(span=(-1, 2), seed=6)
        @example(span=(REGION - 1, 2), seed=7)
        @example(span=(0, REGION + 1), seed=8)
        def run(span: tuple[int, int], seed: int) -> None:
            rig = rigs.get()
            off, length = span
            data = bytes((seed + i) % 255 + 1 for i in range(length))
            before = bytes(rig.buf)
            status = self._edge_write(rigs, rig, rig.remote(off), data, rig.mr.rkey)
            if inside(off, length, REGION):
                assert status is WcStatus.SUCCESS, f"[{off}, {off + length}): {status.name}"
                expect = bytearray(before)
                expect[GUARD + off : GUARD + off + length] = data
                assert rig.buf == expect, f"write of [{off}, {off + length}) landed elsewhere"
            else:
                assert status is WcStatus.REM_ACCESS_ERR, (
                    f"write of [{off}, {off + length}) of a {REGION}-byte region: {status.name}"
                )
                assert bytes(rig.buf) == before, f"refused [{off}, {off + length}) wrote"

        run()

    @rules("iba:mp.remote-bounds", "iba:mp.untouched")
    def test_rdma_read_at_region_edges(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: an RDMA READ inside a region fetches exactly those bytes; one reaching
        outside it → REM_ACCESS_ERR and the local buffer is unchanged."""
        require_opcode(ca.capabilities, QpType.RC, WrType.RDMA_READ)
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(span=spans(REGION))
        @example(span=(0, 1))
        @example(span=(REGION - 1, 1))
        @example(span=(0, REGION))
        @example(span=(-1, 1))
        @example(span=(REGION, 1))
        @example(span=(REGION - 8, 9))
        def run(span: tuple[int, int]) -> None:
            rig = rigs.get()
            off, length = span
            rig.buf[:] = bytes((7 * i) % 251 + 1 for i in range(len(rig.buf)))
            rig.pair.a.put(0, bytes(length))
            status = self._edge_status(rig, SendWr(wr_id=12, opcode=WrType.RDMA_READ,
                                              sg_list=[rig.pair.a.sge(0, length)],
                                                   remote_addr=rig.remote(off),
                                                   rkey=rig.mr.rkey))  # fmt: skip
            got = rig.pair.a.get(0, length)
            if inside(off, length, REGION):
                assert status is WcStatus.SUCCESS, f"[{off}, {off + length}): {status.name}"
                assert got == bytes(rig.buf[GUARD + off : GUARD + off + length])
            else:
                rigs.failed()
                assert status is WcStatus.REM_ACCESS_ERR, (
                    f"read of [{off}, {off + length}) of a {REGION}-byte region: {status.name}"
                )
                assert got == bytes(length), f"refused read of [{off}, {off + length}) landed"

        run()

    @rules("iba:mp.local-bounds", "iba:mp.untouched")
    def test_local_sge_at_region_edges(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.3: an SGE inside its region is sent; one reaching before its first byte or
        after its last completes with a local protection error and nothing is written."""
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(span=spans(REGION))
        @example(span=(0, REGION))
        @example(span=(REGION - 1, 1))
        @example(span=(-1, 1))
        @example(span=(REGION, 1))
        @example(span=(-1, REGION + 2))
        def run(span: tuple[int, int]) -> None:
            rig = rigs.get()
            pair = rig.pair
            local = bytearray(GUARD * 2 + REGION)
            local[:] = bytes(i % 200 + 1 for i in range(len(local)))
            view = memoryview(local)[GUARD : GUARD + REGION]
            mr = pair.a.pd.reg_mem(view, AccessFlags.LOCAL_WRITE)
            off, length = span
            before = bytes(rig.buf)
            status = self._edge_status(rig, SendWr(wr_id=13, opcode=WrType.RDMA_WRITE,
                                              sg_list=[Sge(mr.vaddr + off, length, mr.lkey)],
                                              remote_addr=rig.remote(0),
                                              rkey=rig.mr.rkey))  # fmt: skip
            if inside(off, length, REGION):
                assert status is WcStatus.SUCCESS, f"SGE [{off}, {off + length}): {status.name}"
                assert rig.region[:length] == bytes(local[GUARD + off : GUARD + off + length])
                mr.dereg()
                return
            rigs.failed()
            assert status is not WcStatus.SUCCESS, f"SGE [{off}, {off + length}) outside its region"
            assert bytes(rig.buf) == before, "a refused SGE's bytes reached the responder"
            assert_local_error(pair.caps, status, WcStatus.LOCAL_PROTECTION_ERR)

        run()

    # ----------------------------------------------------------------- keys
    @rules("iba:mp.rkey", "iba:mp.untouched", "ci:10")
    def test_rkeys_near_a_live_key_refused(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 9.7.5.1.3: an R_Key that differs from a live one (in its key byte, its index or
        its top bit) reaches nothing: REM_ACCESS_ERR, the region untouched."""
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(flip=st.integers(1, 2**32 - 1), off=st.sampled_from([0, REGION // 2, REGION - 1]))
        @example(flip=0x1, off=0)
        @example(flip=0xFF, off=0)
        @example(flip=0x100, off=REGION - 1)
        @example(flip=0x8000_0000, off=0)
        @example(flip=0xFFFF_FFFF, off=0)
        def run(flip: int, off: int) -> None:
            rig = rigs.get()
            live = {rig.mr.rkey, rig.pair.b.mr.rkey, rig.mr.lkey, rig.pair.b.mr.lkey}
            forged = rig.mr.rkey ^ flip
            if forged in live:
                return  # another region's key: a valid target, not a forgery
            before = bytes(rig.buf)
            status = self._edge_write(rigs, rig, rig.remote(off), b"forged", forged)
            assert status is WcStatus.REM_ACCESS_ERR, f"R_Key live ^ {flip:#x}: {status.name}"
            assert bytes(rig.buf) == before

        run()

    @rules("iba:mp.dead-keys", "iba:mp.untouched", "ci:78", "ci:80")
    def test_key_after_key_changing_event_refused(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.2 / 10.6.7: after deregister, a re-registration without remote write,
        an unbind, a rebind elsewhere or a destroy, the old R_Key writes nothing
        (REM_ACCESS_ERR) at any byte it used to reach."""
        caps = ca.capabilities
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(event=st.sampled_from(["dereg", "rereg_access", "unbind", "rebind", "destroy_mw"]),
               off=st.sampled_from([0, 1, REGION // 2, REGION - 1]))  # fmt: skip
        @example(event="dereg", off=0)
        @example(event="dereg", off=REGION - 1)
        @example(event="rereg_access", off=0)
        @example(event="unbind", off=0)
        @example(event="rebind", off=REGION - 1)
        @example(event="destroy_mw", off=0)
        def run(event: str, off: int) -> None:
            window = event in ("unbind", "rebind", "destroy_mw")
            if event == "rereg_access" and not caps.modify_mr:
                return  # drawn for a CA without re-registration: nothing to prove
            if window and 1 not in caps.mw_types:
                return
            rig = rigs.get()
            pair = rig.pair
            buf = bytearray(GUARD * 2 + REGION)
            access = _RW | (AccessFlags.MW_BIND if window else AccessFlags.NONE)
            mr = pair.b.pd.reg_mem(memoryview(buf)[GUARD : GUARD + REGION], access)
            base = mr.vaddr
            if not window:
                old = mr.rkey
                if event == "dereg":
                    mr.dereg()
                else:
                    read_only = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ
                    mr.rereg(MrModMask.ACCESS, access=read_only)
            else:
                mw = pair.b.pd.create_mw()
                old = self._edge_bind(pair, mw, mr, base, REGION)
                assert self._edge_write(rigs, rig, base + off, b"b", old) is WcStatus.SUCCESS
                buf[:] = bytes(len(buf))
                if event == "unbind":
                    self._edge_bind(pair, mw, mr, base, 0)
                elif event == "rebind":
                    other = pair.b.pd.reg_mem(bytearray(REGION), access)
                    new = self._edge_bind(pair, mw, other, other.vaddr, REGION)
                    assert new != old, "a rebind kept the window's R_Key"
                else:
                    mw.destroy()
            status = self._edge_write(rigs, rig, base + off, b"s", old)
            assert status is WcStatus.REM_ACCESS_ERR, f"{event}: old R_Key gave {status.name}"
            assert buf == bytes(len(buf)), f"{event}: the old R_Key changed memory"

        run()

    @staticmethod
    def _edge_bind(pair: Pair, mw: Mw, mr: Mr, addr: int, length: int) -> int:
        """Bind (or with length 0 unbind) ``mw`` through B's QP; the new R_Key."""
        rkey = mw.bind(pair.b.qp, BindWr(mr=mr, addr=addr, length=length,
                                         access=AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ,
                                         current_rkey=mw.rkey, wr_id=31))  # fmt: skip
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.status) == (31, WcStatus.SUCCESS), f"bind: {wc.status.name}"
        return rkey

    # --------------------------------------------------------------- windows
    @rules("iba:mp.window-bounds", "iba:mp.untouched", "ci:88")
    def test_window_edges(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 10.6.7: a window bound to 64 bytes in the middle of a region takes writes at its
        first and last byte; one byte either side → REM_ACCESS_ERR, nothing written."""
        caps = ca.capabilities
        require(caps, "mw_types")
        if 1 not in caps.mw_types:
            pytest.skip(f"provider lacks mw_types 1: {caps.reason('mw_types')}")
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(span=spans(64))
        @example(span=(0, 1))
        @example(span=(63, 1))
        @example(span=(-1, 1))
        @example(span=(64, 1))
        @example(span=(0, 64))
        @example(span=(0, 65))
        def run(span: tuple[int, int]) -> None:
            rig = rigs.get()
            pair = rig.pair
            buf = bytearray(GUARD * 2 + REGION)
            view = memoryview(buf)[GUARD : GUARD + REGION]
            mr = pair.b.pd.reg_mem(view, _RW | AccessFlags.MW_BIND)
            start = mr.vaddr + 96
            mw = pair.b.pd.create_mw()
            rkey = self._edge_bind(pair, mw, mr, start, 64)
            off, length = span
            data = bytes(range(1, length + 1)) if length < 256 else bytes(length)
            status = self._edge_write(rigs, rig, start + off, data, rkey)
            expect = bytearray(len(buf))
            if inside(off, length, 64):
                assert status is WcStatus.SUCCESS, f"window [{off}, {off + length}): {status.name}"
                expect[GUARD + 96 + off : GUARD + 96 + off + length] = data
                assert buf == expect
                return
            with deviation(caps, "mw_bounds_check"):
                assert status is WcStatus.REM_ACCESS_ERR, (
                    f"window write of [{off}, {off + length}) of 64 bytes: {status.name}"
                )
                assert buf == expect, "a refused window write changed memory"

        run()

    # --------------------------------------------------------------- atomics
    @rules("iba:at.fetch-add", "iba:at.cmp-swap")
    def test_atomic_operands_keep_64_bits(
        self, ca: Ca, port: PortAttr, peer: tuple[Ca, PortAttr]
    ) -> None:
        """IBA 9.4.5: FETCH_ADD adds modulo 2^64 and CMP_SWAP compares and swaps all 64 bits,
        both returning the original value, for operands with any high bits set."""
        require_opcode(ca.capabilities, QpType.RC, WrType.FETCH_ADD)
        require_opcode(ca.capabilities, QpType.RC, WrType.COMPARE_SWAP)
        rigs = self._edge_rigs(ca, port, peer)

        @EDGES
        @given(init=U64, operand=U64, swap=U64, hit=st.booleans(),
               op=st.sampled_from([WrType.FETCH_ADD, WrType.COMPARE_SWAP]))  # fmt: skip
        @example(init=2**64 - 1, operand=1, swap=0, hit=False, op=WrType.FETCH_ADD)
        @example(init=2**63, operand=2**63, swap=0, hit=False, op=WrType.FETCH_ADD)
        @example(init=2**32 - 1, operand=1, swap=0, hit=False, op=WrType.FETCH_ADD)
        @example(init=2**64 - 1, operand=0, swap=2**63, hit=True, op=WrType.COMPARE_SWAP)
        @example(init=2**63, operand=0, swap=1, hit=False, op=WrType.COMPARE_SWAP)
        @example(init=1, operand=0, swap=2**64 - 1, hit=True, op=WrType.COMPARE_SWAP)
        def run(init: int, operand: int, swap: int, hit: bool, op: WrType) -> None:
            rig = rigs.get()
            pair = rig.pair
            for fmt in ("<Q", ">Q"):
                start = struct.pack(fmt, init)
                pair.b.put(0, start)
                compare = init if hit else init ^ (1 << 63)
                arg = operand if op is WrType.FETCH_ADD else compare
                wc = pair.atomic(op, remote_off=0, local_off=16, compare_add=arg, swap=swap,
                                 wr_id=21)  # fmt: skip
                assert (wc.wr_id, wc.status) == (21, WcStatus.SUCCESS), wc.status.name
                after = pair.b.get(0, 8)
                fetched = pair.a.get(16, 8)

                def result(v: int) -> int:
                    if op is WrType.FETCH_ADD:
                        return v + operand
                    return swap if hit else v

                if atomic_result_ok(start, fetched, after, result):
                    return
            raise AssertionError(
                f"{op.name} init={init:#x} operand={arg:#x} swap={swap:#x}: fetched "
                f"{fetched.hex()}, memory became {after.hex()}"
            )

        run()
