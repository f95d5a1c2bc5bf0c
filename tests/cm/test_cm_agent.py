"""The process-wide CM agent's routing on the mock fabric, spoken to by hand (RawCm).

A REQ nobody listens for is rejected "invalid service ID"; a SIDR_REQ nobody
listens for is answered "unsupported"; malformed and forged MADs are dropped
and counted, never answered.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from cm_world import CmWorld, RawCm, cm_world, req

from ibal.cm.service import CmAgent, agent_of
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason, SidrStatus

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


@pytest.fixture
def raw(world: CmWorld) -> RawCm:
    return RawCm(world.b)  # B's CM class is ours: the agent serves A only


@pytest.fixture
def agent(world: CmWorld, raw: RawCm) -> CmAgent:
    agent = agent_of(world.mgr)
    world.settle()  # PnP registered A's port (B's is taken by the raw CM)
    agent.port(world.a.ca.guid, 1)
    return agent


def test_a_req_nobody_listens_for_is_rejected_invalid_service_id(
    world: CmWorld, raw: RawCm, agent: CmAgent
) -> None:
    raw.send(CmAttr.REQ, req(), world.a.port.lid, tid=0x2_6DC5C06E)
    msg, addr = raw.next(world)
    assert msg.attr is CmAttr.REJ and addr.dlid == world.a.port.lid
    assert msg.tid & 0xFFFFFFFF == 0x6DC5C06E  # the REQ's TID echoed (its low half)
    f = msg.fields
    assert (f["remote_comm_id"], f["local_comm_id"]) == (0xC0FFEE, 0)
    assert f["reason"] == RejReason.INVALID_SERVICE_ID
    assert f["message_rejected"] == MessageMraed.REQ
    assert agent.stats["rej: INVALID_SERVICE_ID"] == 1 and agent.endpoints == 0


def test_a_sidr_req_nobody_listens_for_is_answered_unsupported(
    world: CmWorld, raw: RawCm, agent: CmAgent
) -> None:
    data = cm.SIDR_REQ.encode(request_id=0xABCD, pkey=0xFFFF, service_id=0x77,
                              private_data=bytes(216))  # fmt: skip
    raw.send(CmAttr.SIDR_REQ, data, world.a.port.lid)
    msg, _ = raw.next(world)
    assert msg.attr is CmAttr.SIDR_REP
    assert msg.fields["request_id"] == 0xABCD and msg.fields["service_id"] == 0x77
    assert msg.fields["status"] == SidrStatus.UNSUPPORTED


def test_malformed_and_forged_mads_are_dropped_and_counted(
    world: CmWorld, raw: RawCm, agent: CmAgent
) -> None:
    lid = world.a.port.lid
    # An attribute the CM class does not have.
    raw.send(0x0033, bytes(232), lid)  # type: ignore[arg-type]
    # A REP, a DREQ and an RTU naming comm IDs nobody here has.
    rep = cm.REP.encode(local_comm_id=1, remote_comm_id=0xDEAD, local_qkey=0, local_qpn=5,
                        vendor_id_h=0, local_eecn=0, vendor_id_m=0, starting_psn=0,
                        vendor_id_l=0, responder_resources=0, initiator_depth=0,
                        target_ack_delay=0, failover_accepted=0,
                        end_to_end_flow_control=False, rnr_retry_count=0, srq=False,
                        local_ca_guid=9, private_data=bytes(196))  # fmt: skip
    raw.send(CmAttr.REP, rep, lid)
    raw.send(CmAttr.DREQ, cm.DREQ.encode(local_comm_id=1, remote_comm_id=0xBEEF, remote_qpn=3,
                                         private_data=bytes(220)), lid)  # fmt: skip
    # A GetResp (the CM has no responses).
    mad = bytearray(cm.cm_mad(CmAttr.RTU, 5, local_comm_id=1, remote_comm_id=2))
    mad[3] = 0x81
    raw.send_mad(bytes(mad), lid)
    world.settle()
    assert agent.stats["dropped: malformed"] == 1
    assert agent.stats["dropped: unknown comm ID"] == 1  # the REP
    # The DREQ is answered, as Linux does: its sender may be resending a DREQ whose DREP
    # was lost after our timewait ended.  Its DREP is sent from a callback queue that
    # one flush may already have passed: wait for it, not for the queues.
    msg, _ = raw.next(world)
    assert msg.attr is CmAttr.DREP and msg.tid & 0xFFFFFFFF == 0x1234  # the DREQ's TID
    assert (msg.fields["local_comm_id"], msg.fields["remote_comm_id"]) == (0xBEEF, 1)
    assert agent.stats["drep: unknown comm ID"] == 1
    world.settle()
    with pytest.raises(queue.Empty):
        raw.got.get_nowait()  # nothing else was answered
    assert agent.endpoints == 0
