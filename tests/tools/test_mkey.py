"""``-y``/``--m_key``: the M_Key every SMP of a diagnostic carries, and only SMPs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click
import pytest

from ibal.mad.rpc import MadClient, PortId, smp_request
from ibal.tools.cliopts import m_key_value
from ibal.wire.mad import header
from ibal.wire.mad.consts import PerfAttr, SmpAttr


class _Answering:
    """A MAD port that answers every request at once and keeps what was sent."""

    port_num, port_guid, lid, sm_lid = 1, 0x10, 1, 1

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._on: Callable[[bytes], None] | None = None

    def start(self, on_mad: Callable[[bytes], None]) -> None:
        self._on = on_mad

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        self.sent.append(mad)
        assert self._on is not None
        self._on(bytes(header.respond(mad)))

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        for mad, to, qp, timeout, _tid in items:
            self.send(mad, to, qp, timeout)
        return len(items)

    def abandon(self, tid: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("to", [PortId(2), PortId(dr_path=(1, 3))], ids=["lid", "directed"])
def test_every_smp_carries_the_key_and_no_other_mad_does(to: PortId) -> None:
    port = _Answering()
    client = MadClient(port, m_key=0x0123456789ABCDEF)  # type: ignore[arg-type]
    client.smp_get(SmpAttr.NODE_INFO, to)
    client.call_many([smp_request(SmpAttr.PORT_INFO, to, p) for p in (1, 2)])
    client.perf_get(PerfAttr.CLASS_PORT_INFO, 2)
    smps, pma = port.sent[:3], port.sent[3]
    for mad in smps:  # the M_Key: bytes 24..31 of an SMP, LID routed or directed
        assert mad[24:32] == bytes.fromhex("0123456789abcdef")
    assert pma[1] == 0x04 and pma[24:32] == bytes(8)  # a PMA MAD has no M_Key there
    plain = _Answering()
    MadClient(plain).smp_get(SmpAttr.NODE_INFO, to)  # type: ignore[arg-type]
    assert plain.sent[0][24:32] == bytes(8)
    client.close()


def test_the_key_is_read_as_strtoull_reads_it() -> None:
    assert (m_key_value(None), m_key_value("0x10"), m_key_value("010"), m_key_value("16")) == (
        0, 16, 8, 16)
    with pytest.raises(click.BadParameter):
        m_key_value(str(1 << 64))
    with pytest.raises(ValueError, match="64 bits"):
        MadClient(_Answering(), m_key=-1)  # type: ignore[arg-type]
