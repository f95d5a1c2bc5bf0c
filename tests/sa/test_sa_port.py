"""SaPort on the mock fabric, the SA answered by another ibal agent (tests/sa/sa_world.py).

Time-outs move only when the test steps the ManualClock; GetTable answers
travel in RMPP segments between the two agents' services.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator

import pytest
from sa_world import WAIT, Reply, SaWorld, sa_world

from ibal.sa import SaAnswer, SaPort
from ibal.status import InvalidGuid, InvalidParameter, Status
from ibal.types import MadAddr
from ibal.wire.mad import header, sa
from ibal.wire.mad.consts import MadStatus, Method, SaAttr

NR_MASK = sa.component_mask(sa.NODE_RECORD, ["lid"])


def node_record(lid: int) -> bytes:
    return sa.NODE_RECORD.encode(lid=lid, node_guid=0x1000 + lid, port_guid=0x2000 + lid,
                                 node_type=1, num_ports=1)  # fmt: skip


class Script:
    """What the agent answers, switchable per test: by default NodeRecords 1..n."""

    def __init__(self) -> None:
        self.table_size = 5
        self.drop = 0  # requests to drop before answering
        self.status = 0

    def __call__(self, mad: bytes) -> Reply | None:
        if self.drop:
            self.drop -= 1
            return None
        attr = header.header(mad).attr_id
        if attr == SaAttr.PATH_RECORD:
            rec = sa.PATH_RECORD.encode(slid=1, dlid=2, sl=3, mtu=4, rate=6)
            return Reply([rec], self.status, 8)
        if mad[3] == Method.GET_TABLE:
            recs = [node_record(i) for i in range(1, self.table_size + 1)]
            return Reply(recs, self.status, 14)
        lid = sa.NODE_RECORD.decode(mad[56 : 56 + sa.NODE_RECORD.size])["lid"]
        return Reply([node_record(lid)], self.status, 14)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def world(script: Script) -> Iterator[SaWorld]:
    yield from sa_world(script)


def lids(answer: SaAnswer) -> list[int]:
    return [sa.NODE_RECORD.decode(r[: sa.NODE_RECORD.size])["lid"] for r in answer.records]


def test_a_get_is_answered(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    got: queue.Queue[SaAnswer] = queue.Queue()
    req = port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=9), NR_MASK,
                       callback=got.put)
    a = req.wait(WAIT)
    assert a.ok and a.method == Method.GET_RESP and lids(a) == [9]
    assert got.get(timeout=WAIT) is a and req.done and port.pending == 0
    # The agent saw exactly our request, addressed to the SM LID.
    q = world.sa.requests.get(timeout=WAIT)
    h = header.header(q)
    assert (h.mgmt_class, h.class_version, h.method, h.attr_id) == (3, 2, 1, 0x11)
    assert header.SA_HEADER.decode(q[36:56])["comp_mask"] == NR_MASK


@pytest.mark.parametrize("n", [0, 1, 2, 5, 40])
def test_get_table_in_rmpp_segments_gives_every_record(world: SaWorld, script: Script,
                                                      n: int) -> None:
    script.table_size = n
    port = SaPort.open(world.al, world.client_guid)
    a = port.request(Method.GET_TABLE, SaAttr.NODE_RECORD).wait(WAIT)
    assert a.ok and a.method == Method.GET_TABLE_RESP
    assert lids(a) == list(range(1, n + 1))  # exactly n: no padding read as records
    assert len(a.mad) == 56 + 112 * n


def test_a_single_path_record_table_is_one_record(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    a = port.request(Method.GET_TABLE, SaAttr.PATH_RECORD).wait(WAIT)
    assert a.ok and len(a.records) == 1  # 64 bytes in a 120-byte message, not 3 of a MAD
    assert sa.PATH_RECORD.decode(a.records[0])["sl"] == 3


def test_an_sa_error_status_is_remote_error(world: SaWorld, script: Script) -> None:
    script.status = MadStatus.SA_NO_RECORDS
    a = SaPort.open(world.al, world.client_guid).request(
        Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=9), NR_MASK).wait(WAIT)
    assert (a.status, a.mad_status, a.records) == (Status.REMOTE_ERROR, 0x0300, ())
    assert a.mad[4:6] == b"\x03\x00"


def test_no_answer_times_out_after_every_try(world: SaWorld, script: Script) -> None:
    script.drop = 100
    port = SaPort.open(world.al, world.client_guid)
    req = port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=9), NR_MASK,
                       timeout_ms=200, retry_cnt=2)
    world.step(0.05)
    for n in (1, 2, 3):  # at 0.15, 0.35, 0.55: inside try n's 200 ms (tries at 0, .2, .4)
        world.step(0.1)
        assert len(world.sa.seen) == n and not req.done
        world.step(0.1)
    # 0.65: the third try's time ran out at 0.6
    a = req.wait(WAIT)
    assert a.status is Status.TIMEOUT and "3 tries" in a.detail
    tids = [header.header(m).tid & 0xFFFFFFFF for m in world.sa.seen]
    assert len(tids) == 3 and len(set(tids)) == 3  # each try a new TID


def test_a_lost_first_try_is_retried(world: SaWorld, script: Script) -> None:
    script.drop = 1
    req = SaPort.open(world.al, world.client_guid).request(
        Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=4), NR_MASK, timeout_ms=100)
    world.settle()
    assert not req.done
    world.step(0.1)
    a = req.wait(WAIT)
    assert a.ok and lids(a) == [4] and len(world.sa.seen) == 2


def test_cancel_runs_the_callback_once_with_canceled(world: SaWorld, script: Script) -> None:
    script.drop = 100
    got: list[SaAnswer] = []
    req = SaPort.open(world.al, world.client_guid).request(
        Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=4), NR_MASK,
        timeout_ms=100, callback=got.append)
    world.settle()
    req.cancel()
    req.cancel()
    world.step(1.0)
    assert [a.status for a in got] == [Status.CANCELED] and req.wait(0).status is Status.CANCELED
    assert len(world.sa.seen) == 1  # no retry after the cancel


def test_closing_the_al_cancels_pending_requests(world: SaWorld, script: Script) -> None:
    script.drop = 100
    al = world.mgr.open_al()
    got: list[SaAnswer] = []
    port = SaPort.open(al, world.client_guid)
    req = port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=4), NR_MASK,
                       callback=got.append)
    world.settle()
    al.close(timeout=WAIT)
    assert [a.status for a in got] == [Status.CANCELED] and req.done
    assert not port.alive
    world.step(5.0)
    assert len(got) == 1


def test_awaitable(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)

    async def ask() -> list[SaAnswer]:
        reqs = [port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=i),
                             NR_MASK) for i in (1, 2, 3)]  # fmt: skip
        return list(await asyncio.gather(*(asyncio.wait_for(_aw(r), WAIT) for r in reqs)))

    answers = asyncio.run(ask())
    assert [lids(a) for a in answers] == [[1], [2], [3]]


async def _aw(req: object) -> SaAnswer:
    return await req  # type: ignore[misc,no-any-return]


def test_one_port_per_al_and_port_shared(world: SaWorld) -> None:
    a = SaPort.open(world.al, world.client_guid)
    b = SaPort.open(world.al, world.client_guid)
    assert a is b and a.port_guid == world.client_guid
    a.close()
    assert b.alive
    b.close()
    assert not b.alive
    c = SaPort.open(world.al, world.client_guid)
    assert c is not a and c.alive
    assert SaPort.open(world.al) is not None  # None: the first active port
    with pytest.raises(InvalidGuid):
        SaPort.open(world.al, 0xDEAD)
    with pytest.raises(InvalidParameter):
        c.request(Method.GET, SaAttr.NODE_RECORD, bytes(201))
    with pytest.raises(InvalidParameter):
        c.request(Method.GET, SaAttr.NODE_RECORD, timeout_ms=0)


def test_a_report_reaches_the_listeners_and_is_answered(world: SaWorld) -> None:
    port = SaPort.open(world.al, world.client_guid)
    heard: queue.Queue[tuple[bytes, MadAddr]] = queue.Queue()
    remove = port.add_report_listener(lambda n, who: heard.put((n, who)))
    notice = sa.NOTICE.encode(is_generic=1, type=4, producer_type=4, trap_number=128,
                              issuer_lid=5)
    world.sa.report(world.client_lid, notice)
    got, who = heard.get(timeout=WAIT)
    assert got == notice and who.dlid == world.sa.port.lid
    resp = world.sa.report_resps.get(timeout=WAIT)
    assert resp[3] == Method.REPORT_RESP and header.header(resp).tid & 0xFFFFFFFF == 0x77
    assert resp[56 : 56 + sa.NOTICE.size] == notice
    remove()
    world.sa.report(world.client_lid, notice, tid=0x78)
    world.sa.report_resps.get(timeout=WAIT)  # still answered, nobody listening
    assert heard.empty() and port.stats["reports"] == 2


def test_sa_port_sees_port_events_before_user_clients(world: SaWorld,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PnpOrder.SA: a user client registered first still finds the SA address refreshed."""
    from ibal.al import PnpClass, PnpEvent, PnpRec

    order: list[str] = []
    real = SaPort._on_pnp

    def on_pnp(self: SaPort, rec: PnpRec) -> None:
        if rec.event is PnpEvent.CLIENT_REREGISTER:
            order.append("sa")
        real(self, rec)

    monkeypatch.setattr(SaPort, "_on_pnp", on_pnp)
    world.al.reg_pnp(PnpClass.PORT, lambda rec: order.append("user")
                     if rec.event is PnpEvent.CLIENT_REREGISTER else None)
    port = SaPort.open(world.al, world.client_guid)
    world.settle()
    mock_port = next(p for p in world.fabric.ports() if p.guid == world.client_guid)
    world.fabric.client_reregister(mock_port)
    world.settle()
    world.settle()
    assert order == ["sa", "user"]
    port.close()


def test_only_a_port_with_listeners_takes_the_report_receiver(world: SaWorld) -> None:
    """An SA port that only queries (a subsystem's, in its own AL) leaves the port's
    Reports to the AL that listens for them, whichever opened its port first."""
    quiet = SaPort.open(world.al, world.client_guid)
    other = world.mgr.open_al()
    port = SaPort.open(other, world.client_guid)
    assert port is not quiet
    heard: queue.Queue[bytes] = queue.Queue()
    port.add_report_listener(lambda n, who: heard.put(n))
    assert "reports_elsewhere" not in port.stats
    notice = sa.NOTICE.encode(is_generic=1, type=4, producer_type=4, trap_number=64,
                              issuer_lid=5)
    world.sa.report(world.client_lid, notice)
    assert heard.get(timeout=WAIT) == notice
    assert world.sa.report_resps.get(timeout=WAIT)[3] == Method.REPORT_RESP
    assert quiet.stats["reports"] == 0 and port.stats["reports"] == 1


def test_every_listening_al_of_a_manager_hears_a_report_answered_once(world: SaWorld) -> None:
    """Two AL instances of one manager listen on one port: one receiver serves both
    (ibal.sa.reports), each hears every Report, one ReportResp goes back; when the
    holder's port goes, the other takes the receiver over; the last one out frees it."""
    from ibal.sa.reports import hub_of

    first = SaPort.open(world.mgr.open_al(), world.client_guid)
    second = SaPort.open(world.mgr.open_al(), world.client_guid)
    heard: dict[str, queue.Queue[bytes]] = {"first": queue.Queue(), "second": queue.Queue()}
    first.add_report_listener(lambda n, who: heard["first"].put(n))
    second.add_report_listener(lambda n, who: heard["second"].put(n))
    hub = hub_of(world.mgr, world.client_guid)
    assert hub.holder is first and hub.members() == [first, second]
    for trap, tid in ((64, 0x90), (65, 0x91)):
        notice = sa.NOTICE.encode(is_generic=1, type=4, producer_type=4, trap_number=trap,
                                  issuer_lid=5)  # fmt: skip
        world.sa.report(world.client_lid, notice, tid=tid)
        assert heard["first"].get(timeout=WAIT) == notice
        assert heard["second"].get(timeout=WAIT) == notice
        resp = world.sa.report_resps.get(timeout=WAIT)
        assert resp[3] == Method.REPORT_RESP and header.header(resp).tid & 0xFFFFFFFF == tid
        world.settle()
        assert world.sa.report_resps.empty()  # one ReportResp per Report
    assert "reports_elsewhere" not in second.stats
    assert first.stats["reports"] == 2 and second.stats["reports"] == 2
    first.close()  # the holder goes: the other takes the receiver over
    assert hub.holder is second and hub.members() == [second]
    notice = sa.NOTICE.encode(is_generic=1, type=4, producer_type=4, trap_number=66,
                              issuer_lid=5)
    world.sa.report(world.client_lid, notice, tid=0x92)
    assert heard["second"].get(timeout=WAIT) == notice and heard["first"].empty()
    assert world.sa.report_resps.get(timeout=WAIT)[3] == Method.REPORT_RESP
    second.close()
    assert hub.holder is None and hub.members() == []
    assert hub_of(world.mgr, world.client_guid) is not hub  # the last one out removed it
