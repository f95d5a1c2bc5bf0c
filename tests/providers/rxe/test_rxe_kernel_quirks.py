"""Request streams kernel rxe (Debian 12's 6.1) was seen to send, replayed into ibal's responder.

The lab's clean 16 MiB guest->ibal WRITE stream (tests/lab/test_rxe_faults_lab.py)
once ended with ibal NAKing "invalid request" (``drop_bad_length``).  Reproduced
on the first of a loop of clean transfers under load, with the responder's
packet history recorded: kernel rxe's requester timed out (ibal's ACKs were
late, its ACK timeout 16 ms), went back 128 PSNs and resent; while it did, the
ACK of WRITE k (PSNs P-64..P-1) arrived.  Its retry then numbered a PSN twice:
it resent P as a zero-length WRITE ONLY (WRITE k again, from past its end) and
moved WRITE k+1, first sent as FIRST at P, MIDDLEs from P+1, to FIRST at P+1 ...
LAST at P+64.  ibal had already executed P.. as WRITE k+1, so from its side
the message grew by one packet and its LAST overran the RETH length.  That is
the requester's bug, most likely a race: in 6.1 ``req_retry`` reads the send
queue's consumer index and then the completer's PSN while the completer task
may run on the other CPU (a later upstream series merges the two tasks).
What ibal must do is what it did: NAK, never write outside the R_Key's range,
and fail the QP rather than complete a message of the wrong length.
"""

from __future__ import annotations

from rxeharness import connect

from ibal.types import AsyncEvent, QpState
from ibal.wire import packet as P
from ibal.wire.packet import Opcode, Packet

MTU = 256


def _write(op: Opcode, psn: int, fill: int, n: int = MTU, rkey: int = 0, va: int = 0,
           length: int = 0, ack_req: bool = False) -> Packet:
    p = Packet(op, 0x22, psn, bytes([fill]) * n, ack_req=ack_req)
    p.rkey, p.va, p.dma_len = rkey, va, length
    return p


def test_kernel_rxe_retry_that_renumbers_a_write_is_nakked_within_bounds() -> None:
    _, b = connect(mtu=MTU)
    region = b.mem.register(3 * 1024)
    k, k1 = region.vaddr, region.vaddr + 1024  # WRITE k and k+1, 4 packets each
    first, mid, last = (Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_MIDDLE,
                        Opcode.RC_RDMA_WRITE_LAST)  # fmt: skip
    psn = 0x100
    stream = [
        # WRITE k, then WRITE k+1's first two packets, as first sent
        _write(first, psn, 0xA0, rkey=region.rkey, va=k, length=1024),
        _write(mid, psn + 1, 0xA1),
        _write(mid, psn + 2, 0xA2),
        _write(last, psn + 3, 0xA3, ack_req=True),
        _write(first, psn + 4, 0xB0, rkey=region.rkey, va=k1, length=1024),
        _write(mid, psn + 5, 0xB1),
        # the retry: WRITE k again from past its end, then WRITE k+1 one PSN later
        _write(Opcode.RC_RDMA_WRITE_ONLY, psn + 4, 0, n=0, rkey=region.rkey, va=k,
               ack_req=True),
        _write(first, psn + 5, 0xB0, rkey=region.rkey, va=k1, length=1024),
        _write(mid, psn + 6, 0xB1),
        _write(mid, psn + 7, 0xB2),
        _write(last, psn + 8, 0xB3, ack_req=True),
    ]  # fmt: skip
    answers = []
    for p in stream:
        b.core.receive(p, 0.0)
        answers += [(o.psn - psn, o.syndrome) for o in b.core.poll(0.0)]
    assert answers == [
        (3, P.AETH_ACK_UNLIMITED),  # WRITE k
        (5, P.AETH_ACK_UNLIMITED),  # the zero-length duplicate: ACK of the newest PSN
        (8, P.Nak.INVALID_REQUEST),  # WRITE k+1's LAST, one packet past its length
    ]
    assert b.cfg.state is QpState.ERROR
    assert b.core.out.events == [AsyncEvent.WQ_REQ_ERROR]
    assert b.counters.drops == {"duplicate": 1, "bad_length": 1}
    assert b.counters.duplicate_request == 2
    assert region.buf[:1024] == b"".join(bytes([0xA0 + i]) * MTU for i in range(4))
    # WRITE k+1 got its 4 packets' worth from the shifted stream, nothing beyond it
    assert region.buf[1024:2048] == bytes([0xB0]) * MTU + bytes([0xB1]) * MTU + bytes(
        [0xB1]) * MTU + bytes([0xB2]) * MTU  # fmt: skip
    assert region.buf[2048:] == bytes(1024)
    assert b.core.out.recv_wcs == []
