"""Checks of what only the sample promises, beyond the conformance suite.

They call the channel interface directly, with no access layer, the quickest
way to pin down one behaviour of a provider: packaging, hot-plug, and the
choices the loopback data path makes (no clock, so RNR retries either run out
at once or wait for a receive).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ibal.ci import MANDATORY_VERBS, ProviderManager
from ibal.status import InvalidParameter
from ibal.testing.backdoor import CollectingRegistrar
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AvAttr,
    EventRecord,
    Mtu,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    Wc,
    WcStatus,
    WrType,
)

from ibal_sample_provider import CAPABILITIES, SampleCa, SampleProvider

WALKTHROUGH = Path(__file__).resolve().parents[3] / "docs" / "writing-a-provider.md"
RIGHTS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
VADDR = 0x10_0000


def test_entry_point_makes_the_sample() -> None:
    manager = ProviderManager()
    assert "sample" in manager.names()
    provider = manager.create("sample")
    assert isinstance(provider, SampleProvider)
    assert provider.name == "sample"


def test_every_capability_left_out_has_a_reason() -> None:
    left_out = {
        f.name for f in dataclasses.fields(CAPABILITIES)
        if f.name not in ("reasons", "deviations") and not getattr(CAPABILITIES, f.name)
    }
    partial = {"qp_types", "opcodes"}  # present, but without some members
    assert sorted(left_out | partial) == sorted(CAPABILITIES.reasons)
    assert CAPABILITIES.deviations == {}  # the template breaks no rule


@pytest.mark.skipif(not WALKTHROUGH.exists(), reason="outside the ibal repository")
def test_walkthrough_lists_every_mandatory_verb() -> None:
    text = WALKTHROUGH.read_text()
    assert [v for v in MANDATORY_VERBS if f"`{v}`" not in text] == []


def test_unknown_option_is_refused() -> None:
    with pytest.raises(InvalidParameter, match="colour"):
        SampleProvider({"colour": "blue"})


def test_hot_plug_announces_and_withdraws_the_ca() -> None:
    registrar = CollectingRegistrar(probe=True)
    provider = SampleProvider({"guid": "0x1234"})
    provider.start(registrar)
    assert list(registrar.cis) == [0x1234] and not registrar.probe_errors
    provider.unplug()
    assert registrar.cis == {}
    provider.plug()
    assert list(registrar.cis) == [0x1234]
    provider.stop()
    assert registrar.cis == {}


class Loop:
    """Two RC QPs on the sample's port, connected to each other, sharing one buffer."""

    def __init__(self, ca: SampleCa, rnr_retry_cnt: int = 7) -> None:
        self.ca = ca
        self.events: list[EventRecord] = []
        self.h_ca = ca.open_ca(lambda cq_context: None, self.events.append, "ca")
        self.pd = ca.allocate_pd(self.h_ca, PdType.NORMAL)
        self.cq = ca.create_cq(self.h_ca, 64, "cq").handle
        self.buf = bytearray(4096)
        self.mr = ca.register_mr(self.pd, memoryview(self.buf), VADDR, RIGHTS)
        self.a, self.b = (
            ca.create_qp(self.pd, QpType.RC, QpCaps(), self.cq, self.cq, None, True, name)
            for name in ("a", "b")
        )
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            h = me.handle
            ca.modify_qp(h, QpMod(QpState.INIT, pkey_index=0, port_num=1, access=RIGHTS))
            ca.modify_qp(h, QpMod(
                QpState.RTR, primary_av=AvAttr(port_num=1, dlid=ca.port.lid),
                path_mtu=Mtu.MTU_1024, dest_qp=peer.attr.qp_num, rq_psn=0, resp_res=1,
                rnr_nak_timeout=1,
            ))
            ca.modify_qp(h, QpMod(
                QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7,
                rnr_retry_cnt=rnr_retry_cnt, init_depth=1,
            ))

    def sge(self, offset: int, length: int) -> Sge:
        return Sge(VADDR + offset, length, self.mr.lkey)

    def poll(self) -> list[Wc]:
        return self.ca.poll_cq(self.cq, 64)

    def close(self) -> None:
        for qp in (self.a, self.b):
            self.ca.destroy_qp(qp.handle)
        self.ca.deregister_mr(self.mr.handle)
        self.ca.destroy_cq(self.cq)
        self.ca.deallocate_pd(self.pd)
        self.ca.close_ca(self.h_ca)


@pytest.fixture
def ca() -> Iterator[SampleCa]:
    registrar = CollectingRegistrar()
    provider = SampleProvider({})
    provider.start(registrar)
    assert provider.ca is not None
    yield provider.ca
    provider.stop()


@pytest.fixture
def loop(ca: SampleCa) -> Iterator[Loop]:
    pair = Loop(ca)
    yield pair
    pair.close()


def outcome(wcs: list[Wc]) -> list[tuple[Any, ...]]:
    return [(w.wr_id, w.status) for w in wcs]


def test_send_waits_for_a_receive_when_rnr_retries_are_unlimited(loop: Loop) -> None:
    loop.buf[:5] = b"hello"
    loop.ca.post_send(loop.a.handle, [SendWr(wr_id=1, sg_list=[loop.sge(0, 5)])])
    assert loop.poll() == []  # receiver not ready: the send waits at the head of the queue
    loop.ca.post_recv(loop.b.handle, [RecvWr(wr_id=2, sg_list=[loop.sge(1024, 64)])])
    assert outcome(loop.poll()) == [(2, WcStatus.SUCCESS), (1, WcStatus.SUCCESS)]
    assert loop.buf[1024:1029] == b"hello"


def test_send_fails_at_once_when_rnr_retries_are_limited(ca: SampleCa) -> None:
    pair = Loop(ca, rnr_retry_cnt=3)
    try:
        pair.ca.post_send(pair.a.handle, [SendWr(wr_id=1, sg_list=[pair.sge(0, 5)]),
                                          SendWr(wr_id=2, sg_list=[pair.sge(0, 5)])])
        assert outcome(pair.poll()) == [
            (1, WcStatus.RNR_RETRY_ERR), (2, WcStatus.WR_FLUSHED_ERR)
        ]
        assert pair.ca.query_qp(pair.a.handle).state is QpState.ERROR
    finally:
        pair.close()


def test_refused_rdma_fails_both_ends(loop: Loop) -> None:
    loop.ca.post_recv(loop.b.handle, [RecvWr(wr_id=3, sg_list=[loop.sge(0, 64)])])
    bad_write = SendWr(wr_id=1, opcode=WrType.RDMA_WRITE, sg_list=[loop.sge(0, 8)],
                       remote_addr=VADDR + 4096, rkey=loop.mr.rkey)  # past the region's end
    loop.ca.post_send(loop.a.handle, [bad_write, SendWr(wr_id=2, sg_list=[loop.sge(0, 8)])])
    assert outcome(loop.poll()) == [
        (1, WcStatus.REM_ACCESS_ERR),  # the requester's failure first,
        (2, WcStatus.WR_FLUSHED_ERR),  # then what was queued behind it,
        (3, WcStatus.WR_FLUSHED_ERR),  # then the responder's receive
    ]
    assert [(e.code, e.context) for e in loop.events] == [(AsyncEvent.WQ_ACCESS_ERROR, "b")]
    for qp in (loop.a, loop.b):
        assert loop.ca.query_qp(qp.handle).state is QpState.ERROR
