"""The guest link's parts that need no VM: addresses, qemu arguments, agent, hub, CLI checks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from ibal.lab import Lab, LinkConfig, cli, guest
from ibal.lab.cluster import LinePrefixer
from ibal.lab.link import Hub, plan_links


def test_link_config_gives_guest_i_host_address_i_plus_one() -> None:
    cfg = LinkConfig(subnet="10.77.3.0/29")
    assert [cfg.address(i) for i in range(3)] == ["10.77.3.1/29", "10.77.3.2/29", "10.77.3.3/29"]
    assert cfg.ip(5) == "10.77.3.6"
    with pytest.raises(ValueError, match="no address for guest 6"):
        cfg.address(6)  # .7 is the broadcast address
    assert len({cfg.mac(i) for i in range(256)}) == 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subnet": "fd00::/64"}, "IPv4"),
        ({"mtu": 100}, "MTU"),
        ({"subnet": "10.1.1.1/24"}, "host bits"),
    ],
)
def test_link_config_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinkConfig(**kwargs)  # type: ignore[arg-type]


def test_two_guests_point_at_each_other_more_at_the_hub(tmp_path: Path) -> None:
    two = plan_links(LinkConfig(), 2, tmp_path)
    assert (two[0].local, two[0].remote) == (tmp_path / "guest-0.sock", tmp_path / "guest-1.sock")
    assert (two[1].local, two[1].remote) == (tmp_path / "guest-1.sock", tmp_path / "guest-0.sock")
    three = plan_links(LinkConfig(), 3, tmp_path)
    assert [end.remote.name for end in three] == ["hub-0.sock", "hub-1.sock", "hub-2.sock"]
    with pytest.raises(ValueError, match="at least 2"):
        plan_links(LinkConfig(), 1, tmp_path)


def test_qemu_argv_has_the_link_nic_and_loads_virtio_net(tmp_path: Path) -> None:
    end = plan_links(LinkConfig(), 2, tmp_path)[1]
    argv = Lab().qemu_argv(
        image=tmp_path / "k", initrd=tmp_path / "i", share=tmp_path, control_socket=tmp_path / "c",
        console_log=tmp_path / "log", net=None, link=end,
    )  # fmt: skip
    netdev = argv[argv.index("-netdev") + 1]
    assert netdev == (
        f"dgram,id=link0,local.type=unix,local.path={tmp_path}/guest-1.sock,"
        f"remote.type=unix,remote.path={tmp_path}/guest-0.sock"
    )
    assert f"virtio-net-pci,netdev=link0,mac={end.mac},romfile=" in argv
    assert "ibal_lab.net=1" in argv[argv.index("-append") + 1].split()


def test_agent_puts_rxe_on_the_nic_with_the_links_mac(tmp_path: Path) -> None:
    end = plan_links(LinkConfig(mtu=1500), 2, tmp_path)[0]
    script = guest.agent_script(None, end)
    assert f'[ "$a" = {end.mac} ] && LINK=' in script
    assert 'ip link set "$LINK" mtu 1500' in script
    assert 'ip addr add 10.98.0.1/24 dev "$LINK"' in script
    assert 'rdma link add rxe0 type rxe netdev "$LINK"' in script
    assert "netdev lo" not in script


def _bound(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(10)
    return s


def test_hub_repeats_each_frame_to_every_other_guest(tmp_path: Path) -> None:
    links = plan_links(LinkConfig(), 3, tmp_path)
    guests = [_bound(end.local) for end in links]
    hub = Hub(links)
    try:
        frame = bytes(range(256)) * 40  # a 10 KiB frame stays one datagram
        guests[0].sendto(frame, str(links[0].remote))
        assert guests[1].recv(65536) == frame
        assert guests[2].recv(65536) == frame
        guests[2].sendto(b"back", str(links[2].remote))
        assert guests[0].recv(100) == b"back"
        assert guests[1].recv(100) == b"back"
        guests[0].setblocking(False)
        with pytest.raises(BlockingIOError):
            guests[0].recv(100)  # the first frame never came back to its sender
        # A guest whose socket is gone loses its copy; the others still get theirs.
        guests[1].close()
        guests[0].setblocking(True)
        guests[0].sendto(b"one lost", str(links[0].remote))
        assert guests[2].recv(100) == b"one lost"
    finally:
        hub.close()
        for g in guests:
            g.close()
    assert (hub.forwarded, hub.dropped) == (5, 1)  # read after close: the thread has ended


def test_line_prefixer_writes_whole_lines_per_guest_and_stream() -> None:
    out: list[tuple[str, bytes]] = []
    p = LinePrefixer(lambda stream, data: out.append((stream, data)), 12)
    p(0, "stdout", b"par")
    p(11, "stdout", b"x\ny")
    p(0, "stderr", b"e\n")
    p(0, "stdout", b"tial\n")
    p.flush()
    assert out == [
        ("stdout", b"[11] x\n"),
        ("stderr", b"[00] e\n"),
        ("stdout", b"[00] partial\n"),
        ("stdout", b"[11] y\n"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--peers", "0"], "0 is not in the range"), (["--peers", "2", "--link-mtu", "50"], "MTU")],
)
def test_run_peers_rejects_bad_options_before_booting(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.lab, ["run", *args, "--", "true"])
    assert result.exit_code == 2
    assert message in result.output
