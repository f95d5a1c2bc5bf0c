"""RC between two processes, one rxe device each (127.0.0.2 here, 127.0.0.3 there),
through real sockets: SEND, multi-packet WRITE and READ, both atomics, bytes checked
on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_util import need_root
from rxe_peer import pattern

from ibal.al import AlManager
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import Side, active_port, make_side, to_init, to_rtr, to_rts, wait_wc
from ibal.types import AvAttr, Gid, Grh, Mtu, QpType, SendWr, WcStatus, WcType, WrType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


class Peer:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "rxe_peer.py"), "rxe_peer=127.0.0.3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"peer exited with {self.proc.wait(10)}"
        return json.loads(line)

    def write(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def dump(self, off: int, n: int) -> bytes:
        self.write(f"dump {off} {n}")
        return bytes.fromhex(self.read()["data"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.write("quit")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def pair() -> Iterator[tuple[Side, Peer, dict[str, Any]]]:
    need_root()
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": "rxe_local=127.0.0.2"}))
    peer = Peer()
    try:
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        assert port is not None
        side = make_side(ca, port, QpType.RC, buf_size=64 * 1024)
        info = peer.read()
        gid = port.gid_table[0].gid
        peer.write(json.dumps({"qpn": side.qp.num, "gid": str(gid)}))
        to_init(side.qp, port.port_num, side.mr.access)
        av = AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(info["gid"])))
        to_rtr(side.qp, av, Mtu.MTU_1024, info["qpn"])
        to_rts(side.qp)
        assert peer.read() == {"ready": True}
        yield side, peer, info
    finally:
        peer.close()
        mgr.close()


def _post(side: Side, **wr: Any) -> None:
    side.qp.post_send(SendWr(wr_id=1, **wr))
    wc = wait_wc(side.cq)
    assert (wc.status, wc.wr_id) == (WcStatus.SUCCESS, 1)


def test_rc_send_write_read_atomics(pair: tuple[Side, Peer, dict[str, Any]]) -> None:
    side, peer, info = pair
    rva, rkey = info["vaddr"], info["rkey"]

    msg = pattern(1500, 2)  # two packets at MTU 1024
    side.put(0, msg)
    _post(side, opcode=WrType.SEND, sg_list=[side.sge(0, len(msg))])
    peer.write("recv")
    got = peer.read()
    assert (got["status"], got["wr_id"]) == ("SUCCESS", 7)
    assert bytes.fromhex(got["data"]) == msg

    data = pattern(5000, 3)
    side.put(2048, data)
    _post(side, opcode=WrType.RDMA_WRITE, sg_list=[side.sge(2048, len(data))],
          remote_addr=rva + 16384, rkey=rkey)  # fmt: skip
    assert peer.dump(16384, len(data)) == data
    assert peer.dump(16384 + len(data), 16) == bytes(16)  # not one byte further

    _post(side, opcode=WrType.RDMA_READ, sg_list=[side.sge(8192, 9000)],
          remote_addr=rva + 4096, rkey=rkey)  # fmt: skip
    assert side.get(8192, 9000) == pattern(9000, 1)

    _post(side, opcode=WrType.COMPARE_SWAP, sg_list=[side.sge(24576, 8)],
          remote_addr=rva + 32768, rkey=rkey, compare_add=100, swap=7)  # fmt: skip
    assert int.from_bytes(side.get(24576, 8), "little") == 100
    _post(side, opcode=WrType.FETCH_ADD, sg_list=[side.sge(24584, 8)],
          remote_addr=rva + 32768, rkey=rkey, compare_add=5)  # fmt: skip
    assert int.from_bytes(side.get(24584, 8), "little") == 7
    assert int.from_bytes(peer.dump(32768, 8), "little") == 12


def test_bad_rkey_is_refused_and_memory_untouched(
    pair: tuple[Side, Peer, dict[str, Any]],
) -> None:
    side, peer, info = pair
    before = peer.dump(16384, 64)
    side.put(0, b"\xaa" * 64)
    side.qp.post_send(SendWr(wr_id=2, opcode=WrType.RDMA_WRITE, sg_list=[side.sge(0, 64)],
                             remote_addr=info["vaddr"] + 16384, rkey=info["rkey"] ^ 0xFF))
    wc = wait_wc(side.cq)
    assert (wc.wr_id, wc.wc_type, wc.status) == (2, WcType.RDMA_WRITE, WcStatus.REM_ACCESS_ERR)
    assert peer.dump(16384, 64) == before
