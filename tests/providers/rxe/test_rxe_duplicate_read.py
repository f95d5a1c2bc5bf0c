"""Duplicate READ requests: only a READ the responder still holds is replayed.

Issue 25 §2: the responder re-executed any READ whose PSN looked old (half the
PSN space) for any R_Key and range valid in the PD, so 64 forged 60-byte
datagrams made it send 4.2 MB.  As kernel rxe's ``duplicate_request``: the PSN
must fall in a held READ's PSN range, the R_Key must be that READ's, the range a
sub-range of it; anything else is dropped and counted.
"""

from __future__ import annotations

from rxeharness import connect

from ibal.transport.psn import PSN_MASK
from ibal.wire.packet import Opcode, Packet

READ_RESPONSES = {
    Opcode.RC_RDMA_READ_RESPONSE_FIRST, Opcode.RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode.RC_RDMA_READ_RESPONSE_LAST, Opcode.RC_RDMA_READ_RESPONSE_ONLY,
}  # fmt: skip


def _read_req(psn: int, rkey: int, va: int, length: int) -> Packet:
    p = Packet(Opcode.RC_RDMA_READ_REQUEST, 0x22, psn & PSN_MASK, ack_req=True)
    p.rkey, p.va, p.dma_len = rkey, va, length
    return p


def _sent_bytes(node: object) -> tuple[int, list[int]]:
    out = node.core.poll(0.0, budget=1 << 20)  # type: ignore[attr-defined]
    reads = [o for o in out if o.opcode in READ_RESPONSES]
    return sum(len(o.payload) for o in reads), [o.psn for o in reads]


def test_forged_duplicate_reads_are_not_amplified() -> None:
    _, b = connect(mtu=1024)
    region = b.mem.register(64 * 1024, fill=0x5A)
    for i in range(64):  # each in the "old" half of the PSN space, never executed
        b.core.receive(_read_req(0x100 - 1 - i * 977, region.rkey, region.vaddr, 64 * 1024), 0.0)
    sent, _ = _sent_bytes(b)
    assert sent == 0
    assert b.counters.drops == {"duplicate_read_unknown": 64}
    assert b.counters.duplicate_request == 64


def test_a_held_read_is_replayed_for_its_key_and_a_sub_range_only() -> None:
    _, b = connect(mtu=256)
    region = b.mem.register(1024, fill=0x11)
    other = b.mem.register(1024, fill=0x22)
    b.core.receive(_read_req(0x100, region.rkey, region.vaddr, 1024), 0.0)  # PSNs 0x100..0x103
    sent, psns = _sent_bytes(b)
    assert (sent, psns) == (1024, [0x100, 0x101, 0x102, 0x103])

    # the requester lost the responses: it retransmits the whole READ, or from its third packet
    b.core.receive(_read_req(0x100, region.rkey, region.vaddr, 1024), 0.0)
    assert _sent_bytes(b) == (1024, [0x100, 0x101, 0x102, 0x103])
    b.core.receive(_read_req(0x102, region.rkey, region.vaddr + 512, 512), 0.0)
    assert _sent_bytes(b) == (512, [0x102, 0x103])

    # forged: another key, outside the range, longer, a PSN no READ had
    b.core.receive(_read_req(0x100, other.rkey, other.vaddr, 1024), 0.0)
    b.core.receive(_read_req(0x101, region.rkey, region.vaddr + 768, 512), 0.0)
    b.core.receive(_read_req(0x100, region.rkey, region.vaddr - 256, 256), 0.0)
    b.core.receive(_read_req(0x0FF, region.rkey, region.vaddr, 1024), 0.0)
    assert _sent_bytes(b) == (0, [])
    assert b.counters.drops == {"duplicate_read_mismatch": 3, "duplicate_read_unknown": 1}
