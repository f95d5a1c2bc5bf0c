"""ibal's RMPP against the Linux kernel's, host <-> lab guest over RoCE v2 (IPv6 GIDs).

The host runs tests/mad/rmpp_peer.py over the userspace rxe provider on the
lab's tap (ibal's own RMPP: ``enable_rmpp`` on the AL's QP1); the guest runs
the same peer over the rdma_core provider, whose umad agents are registered
with ``rmpp_version`` 1, so the guest kernel segments, windows, ACKs and
reassembles.  Each side asks the other for a 22-segment SA-style table
(GetTable -> GetTableResp) and sends it a 17-segment RMPP Set answered by a
digest; the bytes are checked on both sides, and the host's capture gives
the kernel's segment headers, checked against the PayloadLength rule ibal
follows.  IPv6 GIDs: over IPv4 the kernel does not match responses
(docs/decisions.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rmpp_peer import SET_BYTES, TABLE_BYTES, RmppPeer, pattern, qp1

from ibal.al import AlManager
from ibal.lab import Lab, LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.types import Gid, QpType

pytestmark = [pytest.mark.lab, pytest.mark.rdma_core, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
GUEST = HERE / "rmpp_kernel_guest.py"
LIBUMAD = Path("/usr/lib/x86_64-linux-gnu/libibumad.so.3")
HOST6, GUEST6 = "fd99::1", "fd99::2"
TCP_PORT = 18720


def _unavailable(reason: str) -> None:
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def link(ibal_lab: Lab) -> Iterator[LabSession]:
    lab_requires("net", "pyverbs")
    if not LIBUMAD.exists():
        _unavailable("libibumad.so.3 missing (apt-get install libibumad3)")
    if os.geteuid() != 0:
        _unavailable("the rxe provider's raw sockets need root")
    lab = Lab(kernel=ibal_lab.kernel_spec, cache_dir=ibal_lab.cache_dir, cpus=2)
    with lab.session(net=True) as s:
        yield s


def _segments(pcap: Path) -> list[dict[str, Any]]:
    """RMPP headers of the SA MADs in the host's capture, in order."""
    from ibal.providers.rxe.wire import split_ethernet
    from ibal.wire.pcap import read_pcap

    out = []
    for rec in read_pcap(pcap)[1]:
        f = split_ethernet(rec.data)
        if f is None:
            continue
        mad = bytes(f.udp_payload[20:276])  # BTH 12 + DETH 8
        if len(mad) < 36 or mad[1] != 0x03 or not mad[26] & 1:
            continue
        out.append({
            "from_host": f.src == ipaddress.IPv6Address(HOST6).packed, "method": mad[3],
            "tid": mad[8:16].hex(),
            "type": mad[25], "flags": mad[26] & 7, "seg": int.from_bytes(mad[28:32], "big"),
            "plen": int.from_bytes(mad[32:36], "big"),
        })  # fmt: skip
    return out


def _check_data_rule(segs: list[dict[str, Any]], n_data: int) -> None:
    """IBA 13.6.3 as Linux applies it: segment 1 says segments*220 - pad, the last
    220 - pad, the others 0; pad in the SA's 200-byte data areas."""
    count = -(-n_data // 200)
    pad = count * 200 - n_data
    by_seg = {s["seg"]: s for s in segs}
    assert sorted(by_seg) == list(range(1, count + 1))
    assert by_seg[1]["plen"] == count * 220 - pad and by_seg[1]["flags"] & 2
    assert by_seg[count]["plen"] == 220 - pad and by_seg[count]["flags"] & 4
    assert all(by_seg[i]["plen"] == 0 for i in range(2, count))


@pytest.mark.timeout(900)
def test_rmpp_both_ways_between_ibal_and_the_kernel(
    link: LabSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = link
    cfg = s.net_config
    assert cfg is not None
    s.host_run(["ip", "-6", "addr", "add", f"{HOST6}/64", "dev", cfg.tap, "nodad"], timeout=30)
    r = s.run(["ip", "-6", "addr", "add", f"{GUEST6}/64", "dev", "eth0", "nodad"], timeout=60)
    assert r.returncode == 0, r.stderr_text
    shutil.copy(GUEST, s.host_dir)
    shutil.copy(HERE / "rmpp_peer.py", s.host_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(HERE.parents[1])
    job = s.guest_start(["python3", s.guest_path(s.host_dir / GUEST.name), str(TCP_PORT),
                         GUEST6, HOST6], timeout=600, env=env)  # fmt: skip
    pcap = tmp_path / "rmpp.pcap"
    monkeypatch.setenv("IBAL_CAPTURE", str(pcap))
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: None if job.done() else job.kill())
        with s.in_netns():
            from ibal.providers.rxe.provider import RxeProvider

            mgr = AlManager()
            stack.callback(mgr.close)
            mgr.add_provider(RxeProvider({"devices": f"rxe0={cfg.tap}"}))
            deadline = time.monotonic() + 180
            while True:  # the guest's python is starting (bounded)
                try:
                    sock = socket.create_connection((cfg.guest_ip, TCP_PORT), timeout=300)
                    break
                except ConnectionRefusedError:
                    assert not job.done() and time.monotonic() < deadline, job.wait()
                    time.sleep(0.2)
        stack.callback(sock.close)
        f = sock.makefile("rw")

        def ask(line: str) -> dict[str, Any]:
            f.write(line + "\n")
            f.flush()
            return dict(json.loads(f.readline()))

        hello = json.loads(f.readline())
        assert hello["mad_agents"] and hello["segments_rmpp"], hello
        assert hello["kernel_rmpp"] == [True, True]  # the kernel runs RMPP for both
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        attr = ca.query().ports[0]
        idx = next(i for i, g in enumerate(attr.gids) if g == Gid(HOST6))
        alias = ca.alloc_pd().get_spl_qp(attr.port_guid, QpType.QP1_ALIAS)
        assert not alias.segments_rmpp
        host = RmppPeer(alias, seed=1, timers=mgr.timers)
        assert [svc.transport_rmpp for svc in host.services] == [False, False]

        # ibal asks, the kernel segments the answer and reassembles the Set.
        mine = host.ask(qp1(Gid(GUEST6), idx))
        # The kernel asks, ibal segments the answer and reassembles the Set.
        theirs = ask("ask")
        served = ask("bye")["served"]
        assert job.wait().returncode == 0

    for got, seed in ((mine, 2), (theirs, 1)):
        assert "error" not in got, got
        assert (got["table_method"], got["table_len"]) == (0x92, TABLE_BYTES)
        assert got["table_sha"] == hashlib.sha256(pattern(TABLE_BYTES, seed)).hexdigest()
        assert got["table_rmpp_area"] == "00" * 12
        assert got["table_tid_match"] and got["table_linked"], got
        assert got["set_method"] == 0x81 and got["set_reply"] == got["set_expected"]
    assert served == ["get_table:256", f"set:{SET_BYTES}"]
    assert host.served == ["get_table:256", f"set:{SET_BYTES}"]

    segs = _segments(pcap)
    assert not [x for x in segs if x["type"] in (3, 4)], segs  # no STOP, no ABORT
    data = [x for x in segs if x["type"] == 1]
    acks = [x for x in segs if x["type"] == 2]
    transfers: dict[tuple[bool, str, int], list[dict[str, Any]]] = {}
    for x in data:
        transfers.setdefault((x["from_host"], x["tid"], x["method"]), []).append(x)
    kinds = sorted((k[0], k[2]) for k in transfers)
    assert kinds == [(False, 0x02), (False, 0x92), (True, 0x02), (True, 0x92)], kinds
    for (_from_host, _tid, method), segs_of in transfers.items():
        _check_data_rule(segs_of, TABLE_BYTES if method == 0x92 else SET_BYTES)
    # The kernel's receiver: its ACK of segment 1 opens a window of 64 (ours: 16), and
    # its ACKs carry the DATA's method with the R bit flipped (so they reach the sender's
    # agent), as ours do.
    kernel_acks = [x for x in acks if not x["from_host"] and x["seg"]]
    assert [x["plen"] for x in kernel_acks if x["seg"] == 1] == [65, 65]
    assert {x["method"] for x in kernel_acks} == {0x12, 0x82}
    ours = [x for x in acks if x["from_host"]]
    assert [x["plen"] for x in ours if x["seg"] == 1] == [17, 17]
    assert {x["method"] for x in ours} == {0x12, 0x82}
    # The kernel as requester of an RMPP Set answers our final ACK with the double-sided
    # ACK (segment 0, NewWindowLast 1: the window for an RMPP answer), method the
    # request's; our receiver, done, drops it (an ACK is not for a receiver).
    ds = [x for x in acks if not x["from_host"] and not x["seg"]]
    assert all((x["method"], x["plen"]) == (0x02, 1) for x in ds), ds
