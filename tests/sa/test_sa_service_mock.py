"""Service registration against the mock fabric's SA, in one process, on one stepped clock:
the AL's renewal timers and the SA's lease expiry move together, so a lease that runs
out and one that is kept are shown without waiting a second of real time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ibal
from ibal.al import AccessLayer
from ibal.clock import ManualClock
from ibal.sa import SaPort, ServiceRecord, register_service
from ibal.status import Status
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

BY_NAME = component_mask(SERVICE_RECORD, ["service_name"])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def al(clock: ManualClock) -> Iterator[AccessLayer]:
    al = ibal.open_al({"mock": {"cas": 2, "clock": clock}}, clock=clock)
    yield al
    al.close(timeout=30)


def ports(al: AccessLayer) -> list[int]:
    return [al.query_ca_by_guid(g).ports[0].port_guid for g in al.get_ca_guids()]


def lookup(sa: SaPort, name: str) -> ServiceRecord | None:
    want = ServiceRecord(service_name=name.encode()).encode()
    ans = sa.request(Method.GET, SaAttr.SERVICE_RECORD, want, BY_NAME).wait(10)
    if ans.status is Status.REMOTE_ERROR and ans.mad_status & 0x7F00 == 0x0300:
        return None
    assert ans.status is Status.SUCCESS, ans
    return ServiceRecord.decode(ans.records[0])


def test_lease_kept_by_renewals_and_one_left_to_run_out(
    al: AccessLayer, clock: ManualClock
) -> None:
    here, there = ports(al)[:2]
    kept = register_service(al, name="kept", service_id=1, lease=10, port_guid=here)
    once = register_service(al, name="once", service_id=2, lease=10, port_guid=here,
                            renew=False)  # fmt: skip
    assert kept.wait(10).ok and once.wait(10).ok
    other = SaPort.open(al, there)
    found = lookup(other, "kept")
    assert found is not None and found.service_gid in al.query_ca_by_guid(
        al.get_ca_guids()[0]).ports[0].gids  # fmt: skip
    for _ in range(6):  # 60 s; advance stops at each renewal and settles the queues
        clock.advance(10.0, settle=al.manager.queues.flush)
        rec = lookup(other, "kept")
        assert rec is not None and 0 < rec.service_lease <= 10, rec
    assert lookup(other, "once") is None  # ran out after 10 s
    assert kept.stats["set"] >= 12 and once.stats["set"] == 1
    kept.dereg(wait=True, timeout=10)
    assert kept.deleted is Status.SUCCESS and lookup(other, "kept") is None
    once.dereg(wait=True, timeout=10)
    assert (once.deleted, once.deleted_mad_status) == (Status.REMOTE_ERROR, 0x0300)
    other.close()
