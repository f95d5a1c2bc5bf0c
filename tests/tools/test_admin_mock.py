"""The vendor-class servers and clients (ibping, ibsysstat) in one process on the mock's
subnet: the answers, the OUI that selects a server, a malformed request dropped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import ibal
from ibal.mad.rpc import MadClient, MadError, PortId, pick_port
from ibal.tools.ping import (
    CPUINFO_ATTR,
    HOSTINFO_ATTR,
    PING_ATTR,
    cpu_info,
    host_and_domain,
    ping,
    ping_server,
    sysstat,
    sysstat_server,
)


@pytest.fixture
def two_cas() -> Iterator[tuple[Any, Any, MadClient]]:
    """The mock's second CA (the servers') and a client on the first."""
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        first, second = (al.open_ca(g) for g in al.get_ca_guids())
        client = MadClient(pick_port(al, first.name, via="agent"), timeout_ms=100, retries=1)
        try:
            yield second, second.query_port(1), client
        finally:
            client.close()


def test_ping_and_sysstat_answer_and_the_oui_selects_the_server(
    two_cas: tuple[Any, Any, MadClient],
) -> None:
    ca, port, client = two_cas
    pings = ping_server(ca, port.port_guid, "mock.peer")
    stats = sysstat_server(ca, port.port_guid)
    try:
        to = PortId(port.lid)
        got = ping(client, to)
        assert got is not None and got[0] == "mock.peer" and got[1] > 0
        assert ping(client, to, oui=0x123456) is None  # no server of that vendor
        assert sysstat(client, to, PING_ATTR) == "sysstat ping succeeded\n"
        assert sysstat(client, to, HOSTINFO_ATTR) == host_and_domain() + "\n"
        cpus = sysstat(client, to, CPUINFO_ATTR)
        assert cpus.startswith("cpu 0: model ") and cpus.endswith("\n\n")  # puts() adds one
        with pytest.raises(MadError, match="ibsystat to Lid"):
            sysstat(client, to, PING_ATTR, oui=0x123456)
        assert (pings.answered, stats.answered) == (1, 3)
    finally:
        pings.close()
        stats.close()


def test_a_reply_that_does_not_fit_is_dropped_and_counted(
    two_cas: tuple[Any, Any, MadClient],
) -> None:
    """A reply function that fails on a request (here: raises FieldError's base) loses the
    request, not the server: the client's retry is answered."""
    ca, port, client = two_cas
    calls = []

    def reply(attr: int) -> bytes:
        calls.append(attr)
        if len(calls) == 1:
            raise ValueError("malformed")
        return b"ok"

    from ibal.tools.ping import PING_CLASS, VendorServer

    srv = VendorServer(ca, port.port_guid, PING_CLASS, reply)
    try:
        got = ping(client, PortId(port.lid))  # the first try dropped, the retry answered
        assert got is not None and got[0] == "ok"
        assert (srv.dropped, srv.answered, len(calls)) == (1, 1, 2)
    finally:
        srv.close()


def test_cpu_info_reads_proc_cpuinfo_as_ibsysstat_does() -> None:
    text = ("processor\t: 0\nmodel name\t: CPU A\ncpu MHz\t\t: 1000.0\n\n"
            "processor\t: 1\nmodel name\t: CPU B\ncpu MHz\t\t: 2000.5\n")  # fmt: skip
    assert cpu_info(text) == [(" CPU A", " 1000.0"), (" CPU B", " 2000.5")]
    assert len(cpu_info("processor\t: 0\n" * 20)) == 8  # ibsysstat's MAX_CPUS
