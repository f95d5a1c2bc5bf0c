"""Chapter: MADs through alias QPs (the AL's own QP1, or the provider's MAD agents)."""

from __future__ import annotations

import queue
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from ibal.status import InvalidParameter, ResourceBusy
from ibal.testing.helpers import is_roce, wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require_qp_type
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    Grh,
    MadAddr,
    MadRecv,
    MadSend,
    MadSendDone,
    PortAttr,
    QpType,
    SendWr,
    UdDest,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al import AliasQp, Ca, MadAgent
    from ibal.ci import Capabilities

VENDOR = 0x09  # vendor class range 1: no kernel agent and no OUI
VENDOR2 = 0x0A
GET, GET_RESP = 0x01, 0x81
WAIT = 20.0


def _mad(mgmt_class: int, method: int, tid_low: int, payload: bytes = b"") -> bytes:
    m = bytearray(MAD_SIZE)
    m[0:4] = bytes([1, mgmt_class, 1, method])
    m[12:16] = tid_low.to_bytes(4, "big")
    m[16:18] = (0x0010).to_bytes(2, "big")
    m[24 : 24 + len(payload)] = payload
    return bytes(m)


def _self_addr(port: PortAttr) -> MadAddr:
    """The port's own QP1: by LID on InfiniBand; on RoCE by an IPv6 GID where there is
    one (the Linux MAD layer matches responses over IPv4 GIDs badly; docs/decisions.md),
    a routable one first: rxe on ``lo`` lists a link-local default GID that no address of
    ``lo`` carries, and the kernel refuses a MAD sent to it (umad_send: EIO)."""
    grh = None
    if is_roce(port):
        gids = list(port.gids)
        ipv6 = [i for i, g in enumerate(gids) if g.ipv4_mapped is None and int(g)]
        index = next((i for i in ipv6 if not gids[i].is_link_local), ipv6[0] if ipv6 else 0)
        grh = Grh(dgid=gids[index], sgid_index=index)
    return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=port.lid, grh=grh)


class Inbox:
    """An agent's callbacks, queued; ``order`` records which kind came when."""

    def __init__(self) -> None:
        self.recvs: queue.Queue[MadRecv] = queue.Queue()
        self.dones: queue.Queue[MadSendDone] = queue.Queue()
        self.order: list[str] = []

    def _recv(self, recv: MadRecv) -> None:
        self.order.append("recv")
        self.recvs.put(recv)

    def _done(self, done: MadSendDone) -> None:
        self.order.append("done")
        self.dones.put(done)

    def agent(self, alias: AliasQp, mgmt_class: int, methods: Any = ()) -> MadAgent:
        return alias.register_agent(
            mgmt_class, 1, methods=methods, recv_cb=self._recv, send_cb=self._done
        )


def _tid_low(mad: bytes) -> int:
    return int.from_bytes(mad[12:16], "big")


class MadChecks(ConformanceBase):
    chapter = "MADs"

    @pytest.fixture
    def alias(self, ca: Ca, caps: Capabilities, port: PortAttr) -> AliasQp:
        if not caps.mad_agents and QpType.QP1 not in caps.special_qps:
            pytest.skip(
                f"provider lacks mad_agents and special_qps: {caps.reason('mad_agents')}; "
                f"{caps.reason('special_qps')}"
            )
        return ca.alloc_pd().get_spl_qp(port.port_guid, QpType.QP1_ALIAS)

    @rules("al:76", "al:78", "al:79")
    def test_request_and_response_between_two_agents_of_a_port(
        self, alias: AliasQp, port: PortAttr
    ) -> None:
        """access-layer rules 76, 78, 79: a Get reaches the agent serving its method; the
        GetResp comes back to the asker by TID, after the asker's send completion."""
        server_in, client_in = Inbox(), Inbox()
        server = server_in.agent(alias, VENDOR, {GET})
        client = client_in.agent(alias, VENDOR)
        req = _mad(VENDOR, GET, 0x5EED, b"ping")
        client.send(MadSend(req, _self_addr(port), timeout_ms=2000, retries=2, context="q"))
        got = server_in.recvs.get(timeout=WAIT)
        assert got.mad[12:] == req[12:] and got.mad[:8] == req[:8]
        assert got.addr.remote_qp == 1 and got.qp_num == 1
        resp = bytearray(got.mad)
        resp[3] = GET_RESP
        resp[24:28] = b"pong"
        server.send(MadSend(bytes(resp), got.addr))
        assert client_in.dones.get(timeout=WAIT) == MadSendDone("q", WcStatus.SUCCESS)
        answer = client_in.recvs.get(timeout=WAIT)
        assert answer.mad == bytes(resp)
        assert client_in.order == ["done", "recv"], "the response overtook the send completion"

    @rules("al:64", "al:74", "al:76")
    def test_requests_reach_the_agent_of_their_class(
        self, alias: AliasQp, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rules 64, 74, 76: alias QPs of one port share its QP1 and carry
        several services; each request reaches the agent of its class."""
        other = ca.alloc_pd().get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
        a_in, b_in, s_in = Inbox(), Inbox(), Inbox()
        a_in.agent(alias, VENDOR, {GET})
        b_in.agent(other, VENDOR2, {GET})
        sender = s_in.agent(alias, VENDOR)
        here = _self_addr(port)
        sender.send(MadSend(_mad(VENDOR2, GET, 2), here))
        sender.send(MadSend(_mad(VENDOR, GET, 1), here))
        assert _tid_low(b_in.recvs.get(timeout=WAIT).mad) == 2
        assert _tid_low(a_in.recvs.get(timeout=WAIT).mad) == 1

    @rules("doc:IBA 9.6.1.1")
    def test_qp1_drops_a_mad_with_the_wrong_qkey(
        self, alias: AliasQp, ca: Ca, port: PortAttr
    ) -> None:
        """IBA 9.6.1.1 / 13.5.3: QP1 takes only datagrams carrying Q_Key 0x80010000.  A MAD an
        ordinary UD QP sends it under another Q_Key is dropped: the next MAD (sent from QP1,
        which always uses the right Q_Key) is the first to reach the agent."""
        require_qp_type(ca.capabilities, QpType.UD)
        server_in, s_in = Inbox(), Inbox()
        server_in.agent(alias, VENDOR, {GET})
        sender = s_in.agent(alias, VENDOR)
        a = self.loop(ca, port, QpType.UD).a
        assert a.av is not None
        a.put(0, _mad(VENDOR, GET, 7))
        a.qp.post_send(SendWr(wr_id=7, sg_list=[a.sge(0, MAD_SIZE)], ud=UdDest(a.av, 1, 0x1234)))
        assert (lambda w: (w.wr_id, w.status))(wait_wc(a.cq)) == (7, WcStatus.SUCCESS)
        sender.send(MadSend(_mad(VENDOR, GET, 8), _self_addr(port)))
        assert _tid_low(server_in.recvs.get(timeout=WAIT).mad) == 8, "QP1 took a bad Q_Key"

    @rules("al:75")
    def test_second_agent_for_a_method_raises_resource_busy(self, alias: AliasQp) -> None:
        """access-layer rule 75 / decisions: a (class, version, method) already served on
        the port → IB_RESOURCE_BUSY."""
        inbox = Inbox()
        inbox.agent(alias, VENDOR, {GET})
        with pytest.raises(ResourceBusy):
            inbox.agent(alias, VENDOR, {GET})

    @rules("doc:decisions")
    def test_malformed_sends_raise_invalid_parameter(
        self, alias: AliasQp, port: PortAttr
    ) -> None:
        """decisions: a MAD that is not 256 bytes, a negative time-out or an SL above 15
        → IB_INVALID_PARAMETER."""
        agent = Inbox().agent(alias, VENDOR)
        good = MadSend(_mad(VENDOR, GET, 3), _self_addr(port))
        for bad in (replace(good, mad=good.mad[:64]), replace(good, timeout_ms=-1),
                    replace(good, addr=replace(good.addr, sl=16))):
            with pytest.raises(InvalidParameter):
                agent.send(bad)

    @rules("al:78")
    def test_send_many_sends_each_once(self, alias: AliasQp, port: PortAttr) -> None:
        """access-layer rule 78 for a batch (``MadAgent.send_many``: the provider's
        ``send_mad_many``, or the AL's loop over ``send_mad``): every MAD reaches the
        agent serving its method, each send completes once; a batch holding a malformed
        MAD → IB_INVALID_PARAMETER and sends none of it."""
        server_in, s_in = Inbox(), Inbox()
        server_in.agent(alias, VENDOR, {GET})
        sender = s_in.agent(alias, VENDOR)
        here = _self_addr(port)
        refused = [MadSend(_mad(VENDOR, GET, 0x200 + i), here) for i in range(3)]
        refused[2] = replace(refused[2], mad=refused[2].mad[:64])
        with pytest.raises(InvalidParameter):
            sender.send_many(refused)
        batch = [MadSend(_mad(VENDOR, GET, 0x100 + i), here, context=i) for i in range(8)]
        assert sender.send_many(batch) == len(batch)
        got = sorted(_tid_low(server_in.recvs.get(timeout=WAIT).mad) for _ in batch)
        assert got == [0x100 + i for i in range(8)], "a MAD of the refused batch was sent"
        dones = sorted((d.context, d.status) for d in (s_in.dones.get(timeout=WAIT) for _ in batch))
        assert dones == [(i, WcStatus.SUCCESS) for i in range(8)]
        assert sender.send_many([]) == 0
