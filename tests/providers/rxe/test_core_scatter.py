"""The transport core over the scatter form of ``MemoryAccess``: ranges as lists of views.

Regions here hand every range cut at each 100-byte boundary of the region
(a :class:`~ibal.transport.scatter.Scatter`), as the mock's physical regions
hand their pages: every way the core reads or writes memory is driven across
those cuts and checked byte for byte.
"""

from __future__ import annotations

import pytest
from rxeharness import Av, FakeMemory, Region, Wire, connect, send_wr

from ibal.transport.scatter import Scatter
from ibal.types import QpType, RecvWr, SendWr, Sge, UdDest, WcStatus, WrType

PART = 100
OK = WcStatus.SUCCESS


class PagedRegion(Region):
    """A region whose ranges come as views cut at every ``PART`` bytes."""

    def view(self, addr: int, length: int) -> memoryview | Scatter:  # type: ignore[override]
        off = addr - self.vaddr
        mv = memoryview(self.buf)
        parts = []
        while length > 0:
            take = min(length, PART - off % PART)
            parts.append(mv[off : off + take])
            off += take
            length -= take
        if len(parts) == 1:
            return parts[0]
        return Scatter(parts)


def paged(mem: FakeMemory, size: int) -> Region:
    r = mem.register(size)
    p = PagedRegion(r.buf, r.vaddr, r.access, r.lkey, r.rkey)
    mem.by_key[p.lkey] = p
    mem.by_key[p.rkey] = p
    return p


def pattern(n: int, seed: int = 3) -> bytes:
    return bytes((i * 13 + seed) & 0xFF for i in range(n))


def test_scatter_slices_and_assigns_across_parts() -> None:
    a, b, c = bytearray(b"abc"), bytearray(b"defg"), bytearray(b"hi")
    s = Scatter([memoryview(a), memoryview(bytearray()), memoryview(b), memoryview(c)])
    assert len(s) == 9 and len(s.parts) == 3
    assert bytes(s) == b"abcdefghi" and bytes(s[2:7]) == b"cdefg"
    assert isinstance(s[3:5], memoryview)  # inside one part: a view, no copy
    assert bytes(s[8:20]) == b"i"  # clipped at the end, as a memoryview is
    s[2:8] = b"XYZUVW"
    assert (a, b, c) == (bytearray(b"abX"), bytearray(b"YZUV"), bytearray(b"Wi"))
    with pytest.raises(ValueError):
        s[0:3] = b"toolong"
    with pytest.raises(ValueError):
        s[0:4:2]
    assert int.from_bytes(s[1:9], "little") == int.from_bytes(b"bXYZUVWi", "little")


@pytest.mark.parametrize("size", [1, 99, 100, 101, 1000, 4097])
def test_write_and_read_through_scattered_ranges(size: int) -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    src = paged(a.mem, 5000)
    dst = paged(b.mem, 5000)
    back = paged(a.mem, 5000)
    src.buf[:size] = pattern(size)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, size, remote=dst, remote_offset=37,
                             wr_id=1))
    a.core.post_send(send_wr(WrType.RDMA_READ, back, size, offset=51, remote=dst,
                             remote_offset=37, wr_id=2))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(1, OK), (2, OK)]
    assert bytes(dst.buf[37 : 37 + size]) == pattern(size)
    assert bytes(back.buf[51 : 51 + size]) == pattern(size)
    assert bytes(dst.buf[:37]) == bytes(37) and not any(dst.buf[37 + size :])


def test_send_gathers_two_scattered_sges_into_a_scattered_receive() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    src = paged(a.mem, 1000)
    dst = paged(b.mem, 2000)
    src.buf[:] = pattern(1000)
    b.post_recv_wr(RecvWr(9, [Sge(dst.vaddr + 150, 300, dst.lkey),
                              Sge(dst.vaddr + 1010, 900, dst.lkey)]))
    a.core.post_send(SendWr(1, WrType.SEND, [Sge(src.vaddr + 50, 400, src.lkey),
                                            Sge(src.vaddr + 520, 350, src.lkey)]))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(1, OK)]
    assert [(c.wr_id, c.status, c.length) for c in b.recv_wcs] == [(9, OK, 750)]
    sent = pattern(1000)[50:450] + pattern(1000)[520:870]
    assert bytes(dst.buf[150:450]) == sent[:300]
    assert bytes(dst.buf[1010:1460]) == sent[300:]


def test_atomic_whose_eight_bytes_cross_a_cut() -> None:
    a, b = connect()
    w = Wire(a, b)
    target = paged(b.mem, 400)
    res = paged(a.mem, 400)
    target.buf[96:104] = (100).to_bytes(8, "little")  # 96..100 and 100..104: two parts
    a.core.post_send(send_wr(WrType.FETCH_ADD, res, 8, offset=196, remote=target,
                             remote_offset=96, compare_add=5, wr_id=1))
    a.core.post_send(send_wr(WrType.COMPARE_SWAP, res, 8, offset=296, remote=target,
                             remote_offset=96, compare_add=105, swap=7, wr_id=2))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(1, OK), (2, OK)]
    assert int.from_bytes(target.buf[96:104], "little") == 7
    assert int.from_bytes(res.buf[196:204], "little") == 100
    assert int.from_bytes(res.buf[296:304], "little") == 105


def test_ud_send_from_a_scattered_range() -> None:
    a, b = connect(QpType.UD)
    w = Wire(a, b, codec=True)
    src = paged(a.mem, 300)
    src.buf[:] = pattern(300)
    dst = paged(b.mem, 400)
    b.post_recv(dst, wr_id=1)
    a.core.post_send(send_wr(WrType.SEND, src, 250, offset=30, wr_id=1,
                             ud=UdDest(Av(b.ip), 0x22, 0x1234)))
    w.run()
    assert [c.status for c in a.send_wcs] == [OK]
    assert [(c.wr_id, c.length) for c in b.recv_wcs] == [(1, 290)]
    assert bytes(dst.buf[40:290]) == pattern(300)[30:280]
