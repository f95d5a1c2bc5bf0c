"""ibal.sa.query on the mock fabric, the SA answered by another ibal agent (sa_world.py):
IBAL's ib_query rules (spec section 3, 106-109) and the Pythonic layer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from sa_world import WAIT, Reply, SaWorld, sa_world

from ibal.sa import (
    GuidPair,
    LidPair,
    QueryRec,
    QueryReq,
    QueryResult,
    QueryType,
    UserQuery,
    get_query_node_rec,
    get_query_path_rec,
    get_query_result,
    node_records,
    node_records_async,
    path_records,
    query,
    user_query,
)
from ibal.status import Error, InvalidGuid, InvalidIndex, InvalidParameter, RemoteError, Status
from ibal.types import AlFlags
from ibal.wire.mad import header, sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr

NODE_GUID_BIT = sa.component_mask(sa.NODE_RECORD, ["node_guid"])


class Agent:
    """Answers NodeRecords 1..5 (filtered by the request's LID / node GUID) and one path."""

    def __init__(self) -> None:
        self.drop = 0
        self.status = 0

    def __call__(self, mad: bytes) -> Reply | None:
        if self.drop:
            self.drop -= 1
            return None
        h = header.header(mad)
        mask = header.SA_HEADER.decode(mad[36:56])["comp_mask"]
        if h.attr_id == SaAttr.PATH_RECORD:
            q = sa.PATH_RECORD.decode(mad[56 : 56 + sa.PATH_RECORD.size])
            rec = sa.PATH_RECORD.encode(slid=q["slid"] or 1, dlid=q["dlid"] or 2,
                                        sgid=q["sgid"], dgid=q["dgid"], sl=q["sl"], mtu=4)
            return Reply([rec], self.status, 8)
        q = sa.NODE_RECORD.decode(mad[56 : 56 + sa.NODE_RECORD.size])
        recs = [sa.NODE_RECORD.encode(lid=i, node_guid=0x1000 + i) for i in range(1, 6)]
        keep = [r for r in recs
                if (not mask & 1 or sa.NODE_RECORD.decode(r)["lid"] == q["lid"])
                and (not mask & NODE_GUID_BIT or sa.NODE_RECORD.decode(r)["node_guid"]
                     == q["node_guid"])]  # fmt: skip
        return Reply(keep, self.status, 14)


@pytest.fixture
def agent() -> Agent:
    return Agent()


@pytest.fixture
def world(agent: Agent) -> Iterator[SaWorld]:
    yield from sa_world(agent)


def test_node_rec_by_guid_callback_echoes_context_and_type(world: SaWorld) -> None:
    got: list[QueryRec] = []
    done = threading.Event()

    def cb(rec: QueryRec) -> None:
        got.append(rec)
        done.set()

    q = query(world.al, QueryReq(QueryType.NODE_REC_BY_NODE_GUID, 0x1003,
                                 port_guid=world.client_guid, query_context="ctx", callback=cb))
    assert q.wait(WAIT) is got[0] and done.is_set()
    [rec] = got
    assert (rec.context, rec.status, rec.query_type, rec.result_cnt) == (
        "ctx", Status.SUCCESS, QueryType.NODE_REC_BY_NODE_GUID, 1)
    assert rec.result_mad is not None
    assert get_query_node_rec(rec.result_mad, 0)["lid"] == 3
    assert get_query_result(rec.result_mad, 0)[:2] == b"\x00\x03"
    with pytest.raises(InvalidIndex):
        get_query_result(rec.result_mad, 1)
    with pytest.raises(InvalidParameter):  # the helpers check attr_id
        get_query_path_rec(rec.result_mad, 0)


def test_sync_runs_the_callback_before_return(world: SaWorld) -> None:
    got: list[QueryRec] = []
    q = query(world.al, QueryReq(QueryType.PATH_REC_BY_LIDS, LidPair(2, 1),
                                 port_guid=world.client_guid, flags=AlFlags.SYNC,
                                 callback=got.append))
    assert len(got) == 1 and q.done and got[0].status is Status.SUCCESS
    assert got[0].result_mad is not None
    p = get_query_path_rec(got[0].result_mad, 0)
    assert (p["slid"], p["dlid"]) == (2, 1)


def test_path_by_port_guids_uses_the_subnet_prefix(world: SaWorld) -> None:
    from ibal import compat

    h_query = compat.ib_query(world.al, QueryReq(
        QueryType.PATH_REC_BY_PORT_GUIDS, GuidPair(0x11, 0x22), port_guid=world.client_guid,
        flags=AlFlags.SYNC))
    rec = h_query.wait(0)
    assert rec.result_mad is not None and rec.result_cnt == 1
    assert compat.ib_get_query_path_rec(rec.result_mad, 0)["slid"] == 1
    compat.ib_cancel_query(world.al, h_query)  # over: nothing happens
    assert h_query.wait(0) is rec
    asked = world.sa.seen[-1]
    q = sa.PATH_RECORD.decode(asked[56 : 56 + sa.PATH_RECORD.size])
    assert q["sgid"][8:] == (0x11).to_bytes(8, "big") and q["dgid"][8:] == (0x22).to_bytes(8, "big")
    assert q["sgid"][:8] == bytes.fromhex("fe80000000000000")
    assert header.SA_HEADER.decode(asked[36:56])["comp_mask"] == sa.component_mask(
        sa.PATH_RECORD, ["sgid", "dgid"])


def test_unknown_type_and_port(world: SaWorld) -> None:
    with pytest.raises(Error):
        query(world.al, QueryReq(12))
    with pytest.raises(InvalidGuid):
        query(world.al, QueryReq(QueryType.CLASS_PORT_INFO, port_guid=0xBAD))
    with pytest.raises(InvalidParameter):
        query(world.al, QueryReq(QueryType.PATH_REC_BY_LIDS, (1, 2)))


def test_retries_then_timeout_and_cancel(world: SaWorld, agent: Agent) -> None:
    agent.drop = 100
    got: list[QueryRec] = []
    query(world.al, QueryReq(QueryType.CLASS_PORT_INFO, port_guid=world.client_guid,
                             timeout_ms=100, retry_cnt=1, callback=got.append))
    world.step(0.15)
    assert len(world.sa.seen) == 2 and got == []
    world.step(0.1)
    assert [r.status for r in got] == [Status.TIMEOUT] and got[0].result_mad is None
    q = query(world.al, QueryReq(QueryType.CLASS_PORT_INFO, port_guid=world.client_guid,
                                 callback=got.append))
    world.settle()
    q.cancel()
    q.cancel()
    world.step(5.0)
    assert [r.status for r in got] == [Status.TIMEOUT, Status.CANCELED]


def test_remote_error_keeps_the_mad(world: SaWorld, agent: Agent) -> None:
    agent.status = MadStatus.SA_REQ_INVALID
    rec = query(world.al, QueryReq(QueryType.NODE_REC_BY_NODE_GUID, 1,
                                   port_guid=world.client_guid, flags=AlFlags.SYNC)).wait(0)
    assert rec.status is Status.REMOTE_ERROR and rec.result_mad is not None
    assert rec.result_mad[4:6] == b"\x02\x00"
    with pytest.raises(RemoteError) as ei:
        node_records(world.al, lid=1, port_guid=world.client_guid)
    assert ei.value.mad_status == 0x0200  # type: ignore[attr-defined]


def test_pythonic_forms(world: SaWorld) -> None:
    recs = node_records(world.al, lid=4, port_guid=world.client_guid)
    assert [(r.lid, r["node_guid"]) for r in recs] == [(4, 0x1004)]
    assert [r.lid for r in node_records(world.al, port_guid=world.client_guid)] == [1, 2, 3, 4, 5]
    assert node_records(world.al, lid=9, port_guid=world.client_guid) == []
    got: list[QueryResult] = []
    done = threading.Event()
    node_records(world.al, guid=0x1002, port_guid=world.client_guid,
                 callback=lambda r: (got.append(r), done.set()))
    assert done.wait(WAIT) and [r.lid for r in got[0].records] == [2]

    async def both() -> list[list[int]]:
        a = node_records_async(world.al, lid=1, port_guid=world.client_guid)
        b = node_records_async(world.al, lid=5, port_guid=world.client_guid)
        return [[r.lid for r in x] for x in await asyncio.gather(a, b)]

    assert asyncio.run(both()) == [[1], [5]]


def test_path_selectors_and_user_query(world: SaWorld) -> None:
    from ibal.sa import Selector

    [p] = path_records(world.al, 2, 1, sl=3, mtu=(Selector.GREATER, 3), rate=6,
                       port_guid=world.client_guid)
    asked = world.sa.seen[-1]
    mask = header.SA_HEADER.decode(asked[36:56])["comp_mask"]
    assert mask == sa.component_mask(sa.PATH_RECORD, ["slid", "dlid", "sl", "mtu_selector",
                                                      "mtu", "rate_selector", "rate"])
    q = sa.PATH_RECORD.decode(asked[56 : 56 + sa.PATH_RECORD.size])
    assert (q["mtu_selector"], q["mtu"], q["rate_selector"], q["rate"]) == (0, 3, 2, 6)
    assert (p.slid, p.dlid, p.sl) == (2, 1, 3)
    recs = user_query(world.al, Method.GET_TABLE, SaAttr.NODE_RECORD,
                      sa.component_mask(sa.NODE_RECORD, ["lid"]), sa.NODE_RECORD.encode(lid=2),
                      port_guid=world.client_guid)
    assert [r.lid for r in recs] == [2]
    rec = query(world.al, QueryReq(QueryType.USER_DEFINED, UserQuery(
        Method.GET_TABLE, SaAttr.NODE_RECORD, 0, 0, b""), port_guid=world.client_guid,
        flags=AlFlags.SYNC)).wait(0)
    assert rec.result_cnt == 5
