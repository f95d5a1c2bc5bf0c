"""NVMe over Fabrics (RDMA): Linux's host vs ibal's host on one nvmet-rdma target, and
Linux's host on ibal's target, in one lab guest boot.

Four-way table of two workloads at queue depth 32 (one I/O queue for ibal; fio with
``--iodepth=32`` for Linux, which spreads it over its queues):

* 4 KiB random reads (IOPS),
* 128 KiB sequential reads (MiB/s),

measured for

1. Linux ``nvme-rdma`` (fio, libaio, O_DIRECT) in the guest against ``nvmet-rdma`` in the
   same guest (kernel rxe on eth0, both ends emulated by TCG on the guest's CPUs),
2. ibal's host (``ibal.ulp.nvme.host``, userspace rxe on the host side of the tap)
   against that same target,
3. Linux ``nvme-rdma`` in the guest against ibal's target (``ibal.ulp.nvme.target``,
   userspace rxe on the host side, a file in the host's /tmp).

Run from the host, as root (the lab's ``--net``)::

    python benchmarks/bench_nvme.py [--seconds 10] [--cpus 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibal.al import AccessLayer, AlManager  # noqa: E402
from ibal.lab import Lab, LabSession  # noqa: E402
from ibal.providers.rxe.provider import RxeProvider  # noqa: E402
from ibal.ulp.nvme.controller import Namespace, Subsystem  # noqa: E402
from ibal.ulp.nvme.host import Controller, HostOptions  # noqa: E402
from ibal.ulp.nvme.target import Target  # noqa: E402

NQN = "nqn.2026-12.org.ibal:bench"
IBAL_NQN = "nqn.2026-12.org.ibal:bench-served"
HOSTID = "4f1b1c2e-2323-4d4d-9a9a-0123456789ac"
IMG_MIB = 64
QD = 32

TARGET_UP = """set -e
modprobe nvmet-rdma
mount -t configfs none /sys/kernel/config 2>/dev/null || true
S=/sys/kernel/config/nvmet/subsystems/{nqn}
P=/sys/kernel/config/nvmet/ports/1
dd if=/dev/urandom of=/run/bench.img bs=1M count={mib} status=none
mkdir -p $S/namespaces/1 $P
echo 1 > $S/attr_allow_any_host
echo -n /run/bench.img > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io
echo 1 > $S/namespaces/1/enable
echo rdma > $P/addr_trtype; echo ipv4 > $P/addr_adrfam
echo {addr} > $P/addr_traddr; echo 4420 > $P/addr_trsvcid
ln -s $S $P/subsystems/{nqn}
"""

FIO = """set -e
modprobe nvme-rdma
nvme connect -t rdma -a {addr} -s 4420 -n {nqn} -q nqn.2014-08.org.nvmexpress:uuid:{hostid} \\
    -I {hostid} >/dev/null
dev=""
for i in $(seq 1 100); do
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn)" = "{nqn}" ] && [ -e /dev/$(basename $c)n1 ] && dev=/dev/$(basename $c)n1
  done
  [ -n "$dev" ] && break; sleep 0.1
done
for job in "randread 4k" "read 128k"; do
  set -- $job
  fio --name=b --filename=$dev --rw=$1 --bs=$2 --iodepth={qd} --ioengine=libaio --direct=1 \\
      --runtime={secs} --time_based --output-format=json
done
nvme disconnect -n {nqn} >/dev/null
"""


def fio_figures(out: str) -> tuple[float, float]:
    """(4 KiB random read IOPS, 128 KiB sequential read MiB/s) from two fio JSON reports."""
    dec = json.JSONDecoder()
    reports, i = [], 0
    while len(reports) < 2:
        i = out.index("{", i)
        obj, i = dec.raw_decode(out, i)
        reports.append(obj["jobs"][0]["read"])
    return reports[0]["iops"], reports[1]["bw"] / 1024.0


@contextlib.contextmanager
def host_al(s: LabSession) -> Iterator[AccessLayer]:
    cfg = s.net_config
    assert cfg is not None
    with s.in_netns():
        mgr = AlManager()
        mgr.add_provider(RxeProvider({"devices": f"rxe0={cfg.host_ip}"}))
    try:
        yield mgr.open_al()
    finally:
        mgr.close()


def ibal_host(al: AccessLayer, addr: str, secs: float) -> tuple[float, float]:
    opts = HostOptions(io_queues=1, queue_size=QD, max_io=128 * 1024)
    with Controller(al, addr, NQN, opts) as ctrl:
        dev = ctrl.namespace(1)
        bs4 = 4096 // dev.block
        rnd = random.Random(0)

        def run(nblocks: int, sequential: bool) -> int:
            done, nxt = 0, 0
            inflight: list[int] = []
            end = time.monotonic() + secs

            def lba() -> int:
                nonlocal nxt
                if sequential:
                    x = nxt
                    nxt = (nxt + nblocks) % (dev.blocks - nblocks)
                    return x
                return rnd.randrange(0, dev.blocks - nblocks) // nblocks * nblocks

            for _ in range(QD):
                inflight.append(ctrl.submit_read(1, lba(), nblocks, dev.block))
            while time.monotonic() < end:
                ctrl.complete(inflight.pop(0))
                done += 1
                inflight.append(ctrl.submit_read(1, lba(), nblocks, dev.block))
            for cid in inflight:
                ctrl.complete(cid)
            return done

        iops = run(bs4, False) / secs
        seq = run(128 * 1024 // dev.block, True) * 128 / 1024 / secs
    return iops, seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    secs = args.seconds
    lab = Lab(cpus=args.cpus)
    rows: dict[str, tuple[float, float]] = {}
    with lab.session(net=True) as s:
        cfg = s.net_config
        assert cfg is not None
        r = s.run(TARGET_UP.format(nqn=NQN, mib=IMG_MIB, addr=cfg.guest_ip), timeout=300)
        r.check_returncode()
        r = s.run(FIO.format(addr=cfg.guest_ip, nqn=NQN, hostid=HOSTID, qd=QD, secs=int(secs)),
                  timeout=600)  # fmt: skip
        if r.returncode:
            sys.exit(f"fio against nvmet: {r.stderr_text}")
        rows["Linux host -> nvmet-rdma (both in the guest)"] = fio_figures(r.stdout_text)
        with host_al(s) as al:
            rows["ibal host (rxe, host side) -> nvmet-rdma"] = ibal_host(al, cfg.guest_ip, secs)
            with tempfile.TemporaryDirectory() as tmp:
                img = Path(tmp) / "served.img"
                img.write_bytes(random.Random(1).randbytes(IMG_MIB << 20))
                subsys = Subsystem(IBAL_NQN, [Namespace(1, path=str(img), block=4096)])
                with Target(al, subsys, cfg.host_ip):
                    r = s.run(FIO.format(addr=cfg.host_ip, nqn=IBAL_NQN, hostid=HOSTID, qd=QD,
                                         secs=int(secs)), timeout=600)  # fmt: skip
                subsys.close()
            if r.returncode:
                sys.exit(f"fio against ibal's target: {r.stderr_text}")
            rows["Linux host -> ibal target (rxe, host side)"] = fio_figures(r.stdout_text)
    print(f"{'':48} {'4 KiB randread IOPS':>20} {'128 KiB seqread MiB/s':>22}")
    for name, (iops, bw) in rows.items():
        print(f"{name:48} {iops:20.0f} {bw:22.1f}")
    base = rows["Linux host -> nvmet-rdma (both in the guest)"]
    ib = rows["ibal host (rxe, host side) -> nvmet-rdma"]
    print(f"ibal host / Linux host: IOPS {ib[0] / base[0]:.2f}x, bandwidth {ib[1] / base[1]:.2f}x")
    print(json.dumps({k: {"iops_4k": v[0], "mib_s_128k": v[1]} for k, v in rows.items()}))


if __name__ == "__main__":
    main()
