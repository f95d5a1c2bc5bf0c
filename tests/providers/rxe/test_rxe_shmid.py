"""``ib_reg_shmid`` across two processes and two rxe devices: the peer process
registers a shared-memory segment by name, this process registers the same name,
and an RDMA WRITE over the sockets into the peer's registration is seen through
this process's own registration (the same pages, mapped twice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from multiprocessing import shared_memory
from pathlib import Path

from netns_util import need_root

from ibal.al import AlManager
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import active_port, make_side, to_init, to_rtr, to_rts, wait_wc
from ibal.types import AccessFlags, AvAttr, Gid, Grh, Mtu, QpType, SendWr, WcStatus, WrType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def test_write_into_the_peers_registration_lands_in_ours() -> None:
    need_root()
    seg = shared_memory.SharedMemory(name=f"ibal-{uuid.uuid4().hex[:16]}", create=True,
                                     size=2 * 4096)  # fmt: skip
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": "rxe_shm0=127.0.0.2"}))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    peer = subprocess.Popen(
        [sys.executable, str(HERE / "rxe_shmid_peer.py"), "rxe_shm1=127.0.0.3", seg.name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert peer.stdin is not None and peer.stdout is not None
    try:
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        assert port is not None
        side = make_side(ca, port, QpType.RC, buf_size=4096)
        ours = side.pd.reg_shmid(seg.name, AccessFlags.LOCAL_WRITE)
        line = peer.stdout.readline()
        assert line, f"peer exited with {peer.wait(10)}"
        info = json.loads(line)
        peer.stdin.write(json.dumps({"qpn": side.qp.num, "gid": str(port.gid_table[0].gid)})
                         + "\n")  # fmt: skip
        peer.stdin.flush()
        to_init(side.qp, port.port_num, side.mr.access)
        to_rtr(side.qp, AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(info["gid"]))),
               Mtu.MTU_1024, info["qpn"])  # fmt: skip
        to_rts(side.qp)
        assert json.loads(peer.stdout.readline()) == {"ready": True}
        data = bytes(range(256)) * 6  # two packets at MTU 1024
        side.put(0, data)
        side.qp.post_send(SendWr(wr_id=1, opcode=WrType.RDMA_WRITE,
                                 sg_list=[side.sge(0, len(data))],
                                 remote_addr=info["vaddr"] + 3000, rkey=info["rkey"]))  # fmt: skip
        wc = wait_wc(side.cq)
        assert (wc.wr_id, wc.status) == (1, WcStatus.SUCCESS)
        assert ours.buffer is not None
        assert bytes(ours.buffer[3000 : 3000 + len(data)]) == data
        assert bytes(ours.buffer[3000 + len(data) : 3000 + len(data) + 8]) == bytes(8)
        ours.dereg()
    finally:
        if peer.poll() is None:
            peer.stdin.write("quit\n")
            peer.stdin.flush()
            try:
                peer.wait(20)
            except subprocess.TimeoutExpired:
                peer.kill()
        mgr.close()
        seg.close()
        seg.unlink()
