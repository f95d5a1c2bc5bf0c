"""ibal.sa's queries in one process against the mock fabric's own SA agent (no ibsim):
the Pythonic layer and the IBAL shape answer from the fabric's state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ibal.al import AccessLayer, AlManager
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa import (
    LidPair,
    QueryReq,
    QueryType,
    get_query_path_rec,
    node_records,
    path_records,
    port_info_records,
    query,
)
from ibal.status import Status
from ibal.types import AlFlags


@pytest.fixture
def world() -> Iterator[tuple[MockFabric, AccessLayer]]:
    fabric = MockFabric(seed=5)
    for _ in range(3):
        fabric.add_ca()
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        yield fabric, mgr.open_al()
    finally:
        mgr.close(timeout=10)
        fabric.close()


def test_queries_answer_from_the_fabric(world: tuple[MockFabric, AccessLayer]) -> None:
    fabric, al = world
    me = fabric.cas[1].ports[0]
    other = fabric.cas[2].ports[0]
    [nr] = node_records(al, lid=other.lid, port_guid=me.guid, timeout_ms=2000)
    assert (nr.lid, nr.node_guid) == (other.lid, fabric.cas[2].guid)
    lids = sorted(r.lid for r in node_records(al, port_guid=me.guid, timeout_ms=2000))
    assert lids == sorted([p.lid for p in fabric.ports()] + [fabric.switch.lid])  # RMPP table
    [pir] = port_info_records(al, lid=me.lid, port_guid=me.guid, timeout_ms=2000)
    assert (pir.endport_lid, pir.lid) == (me.lid, me.lid)
    [pr] = path_records(al, me.lid, other.lid, port_guid=me.guid, timeout_ms=2000)
    assert (pr.slid, pr.dlid) == (me.lid, other.lid)
    rec = query(al, QueryReq(QueryType.PATH_REC_BY_LIDS, LidPair(me.lid, other.lid),
                             port_guid=me.guid, flags=AlFlags.SYNC, timeout_ms=2000)).wait(0)
    assert rec.status is Status.SUCCESS and rec.result_cnt == 1 and rec.result_mad
    assert get_query_path_rec(rec.result_mad, 0)["dlid"] == other.lid
