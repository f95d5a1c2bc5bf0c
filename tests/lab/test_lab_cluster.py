"""Two lab guests on one virtual link (`Lab.cluster(2)`): kernel rxe on each end.

One pair of boots for the module; each test leaves both guests as it found
them. The link is a qemu dgram netdev between the guests' Unix sockets, so it
needs no host privilege and never touches a host address.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import lab_leftovers

from ibal.lab import Lab, LabBootError, LabCluster, LabSession
from ibal.lab.cluster import run_on_all
from ibal.lab.pytest_plugin import lab_requires
from ibal.tools.rping_proto import ping_text

pytestmark = pytest.mark.lab

_COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"


def test_a_guest_that_does_not_boot_takes_the_other_down(
    ibal_lab: Lab, assert_cleaned: Callable[[LabSession], None]
) -> None:
    # First in the module: the check counts every qemu child, and the pair is not up yet.
    failing = LabCluster(ibal_lab, 2, boot_timeout=0.01)
    with pytest.raises(LabBootError, match="not ready after"):
        failing.start()
    for s in failing:
        assert_cleaned(s)
    assert not failing.tmp.exists()
    assert lab_leftovers(failing.tmp, None) == []
    assert all(g.qemu_pid and not Path(f"/proc/{g.qemu_pid}").exists() for g in failing)


@pytest.fixture(scope="module")
def pair_guests(ibal_lab: Lab) -> Iterator[LabCluster]:
    with ibal_lab.cluster(2) as pair:
        yield pair


@pytest.fixture
def pair(pair_guests: LabCluster) -> LabCluster:
    if not pair_guests.alive:
        pytest.fail("the module's two guests are gone (an earlier test ended them)", pytrace=False)
    return pair_guests


def _counter(s: LabSession, name: str) -> int:
    r = s.run(["cat", f"{_COUNTERS}/{name}"], timeout=60)
    assert r.returncode == 0, r.stderr_text
    return int(r.stdout_text)


# Per guest: its environment's view of the link, the NIC that has its address,
# that NIC's MTU and MAC, rdma's netdev for rxe0, and rxe0's IPv4-mapped GID.
_SHOW = (
    'echo "$IBAL_LAB_PEER $IBAL_LAB_ADDRESS $IBAL_LAB_PEERS"; '
    "dev=$(ip -o -4 addr show | "
    'awk -v a="$IBAL_LAB_ADDRESS" \'index($4, a "/") == 1 {print $2}\'); '
    'echo "$dev $(cat /sys/class/net/$dev/mtu) $(cat /sys/class/net/$dev/address)"; '
    "rdma link show rxe0/1; cat /sys/class/infiniband/rxe0/ports/1/gids/1"
)


def test_both_guests_up_with_rxe0_on_their_link_address(pair: LabCluster) -> None:
    results = run_on_all(pair, _SHOW, timeout=120)
    assert pair.addresses == ["10.98.0.1", "10.98.0.2"]
    for i, r in enumerate(results):
        assert r.returncode == 0, r.stderr_text
        env_line, nic_line, rdma_line, gid = r.stdout_text.splitlines()
        assert env_line == f"{i} {pair.addresses[i]} 10.98.0.1 10.98.0.2"
        dev, mtu, mac = nic_line.split()
        assert (mtu, mac) == ("9000", pair.links[i].mac)
        assert "state ACTIVE" in rdma_line and rdma_line.split()[-1] == dev
        a, b, c, d = (int(x) for x in pair.addresses[i].split("."))
        assert gid == f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"


def test_ping_crosses_the_link_and_teaches_each_end_the_others_mac(pair: LabCluster) -> None:
    a, b = pair
    r = a.run(["busybox", "ping", "-c", "3", "-W", "10", pair.addresses[1]], timeout=120)
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "3 packets transmitted, 3 packets received" in r.stdout_text
    # The echo request came from guest 0's NIC: guest 1 learned that MAC for its address.
    neigh = b.run(["ip", "neigh", "show", pair.addresses[0]], timeout=60).stdout_text
    assert f"lladdr {pair.links[0].mac}" in neigh


@pytest.mark.timeout(300)
def test_rping_between_the_two_kernel_rxe_devices(pair: LabCluster) -> None:
    """librdmacm's rping: guest 1's server RDMA-READs each ping from guest 0 across the link."""
    lab_requires("rdmacm")
    a, b = pair
    server_ip = pair.addresses[1]
    size, count = 100, 3
    before = (_counter(a, "sent_pkts"), _counter(b, "rcvd_pkts"))
    server = b.guest_start(
        ["rping", "-s", "-a", server_ip, "-C", str(count), "-S", str(size), "-v"], timeout=180
    )
    try:
        deadline = time.monotonic() + 90
        while True:  # bounded retry while the server is not listening yet
            cli = a.run(
                ["rping", "-c", "-a", server_ip, "-C", str(count), "-S", str(size), "-v", "-V"],
                timeout=90,
            )
            if cli.returncode == 0 or server.done() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        srv = server.wait(timeout=120)
    finally:
        if not server.done():
            server.kill()
    assert cli.returncode == 0, cli.stderr_text
    assert srv.returncode == 0, srv.stderr_text
    # rping prints the buffer up to its NUL; the server's copy came by RDMA READ from guest 0.
    expected = [
        "server ping data: " + ping_text(n, size).rstrip(b"\0").decode() for n in range(count)
    ]
    assert [ln for ln in srv.stdout_text.splitlines() if ln.startswith("server ping")] == expected
    after = (_counter(a, "sent_pkts"), _counter(b, "rcvd_pkts"))
    # Kernel rxe counted the RoCE packets on both ends: they crossed the link, not a loopback.
    assert after[0] - before[0] >= count and after[1] - before[1] >= count
