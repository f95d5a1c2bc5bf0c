"""ibal's SRP initiator (ibal.ulp.srp, userspace rxe on the tap's address) against Linux's
``ib_srpt`` in the lab guest, logging in through the RDMA CM as Linux's ``ib_srp`` does
over RoCE.

The guest's target is configured through configfs: LIO's fileio backstore on a file
in the guest's tmpfs, one srpt target port named by the port's GID 0 with one LUN
and an ACL for ibal's initiator port identifier, and srpt's RDMA CM listen port.
One ``--net`` guest for the module.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import random
from collections.abc import Iterator

import pytest
from guest_peers import guest_sha as guest_sha_of
from guest_peers import host_rxe

from ibal.al import AccessLayer, PnpClass, PnpEvent, PnpRec
from ibal.dm import Discovery, RocePeer
from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.types import Gid
from ibal.ulp.srp import wire as w
from ibal.ulp.srp.initiator import ScsiError, SrpInitiator, SrpLoginRejected

pytestmark = pytest.mark.lab

PORT = 5555
IMG = "/run/srp-lab.img"
MIB = 4
BLOCK = 512
INITIATOR = bytes.fromhex("0123456789abcdeffedcba9876543210")

TARGET_UP = """set -e
modprobe ib_srpt
modprobe target_core_file
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
T=/sys/kernel/config/target
GID=$(tr -d : < /sys/class/infiniband/rxe0/ports/1/gids/0)
W=$T/srpt/0x$GID
if [ ! -e $W/tpgt_1/enable ] || [ "$(cat $W/tpgt_1/enable)" != 1 ]; then
  mkdir -p $T/srpt
  echo {port} > $T/srpt/discovery_auth/rdma_cm_port
  dd if=/dev/zero of={img} bs=1M count={mib} status=none
  mkdir -p $T/core/fileio_0/disk0
  echo "fd_dev_name={img},fd_dev_size={size}" > $T/core/fileio_0/disk0/control
  echo 1 > $T/core/fileio_0/disk0/enable
  mkdir -p $W/tpgt_1/lun/lun_0
  ln -s $T/core/fileio_0/disk0 $W/tpgt_1/lun/lun_0/disk0
  mkdir -p $W/tpgt_1/acls/{acl}/lun_0
  ln -s $W/tpgt_1/lun/lun_0 $W/tpgt_1/acls/{acl}/lun_0/lun0
  echo 1 > $W/tpgt_1/enable
fi
cat /sys/module/ib_srpt/parameters/srpt_service_guid
"""


def _addrs(s: LabSession) -> tuple[str, str]:
    cfg = s.net_config
    assert cfg is not None
    return cfg.host_ip, cfg.guest_ip


def target_up(s: LabSession) -> bytes:
    """Configure the target (once per guest); the target port identifier it expects
    (its service GUID, twice)."""
    lab_requires("net")
    r = s.run(TARGET_UP.format(port=PORT, img=IMG, mib=MIB, size=MIB << 20,
                               acl="0x" + INITIATOR.hex()), timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr_text + r.stdout_text
    guid = int(r.stdout_text.split()[-1], 16).to_bytes(8, "big")
    return guid + guid


def guest_sha(s: LabSession, offset: int, length: int) -> str:
    """SHA-256 of ``length`` bytes of the target's backing file, read in the guest."""
    return guest_sha_of(s, IMG, offset, length)


@contextlib.contextmanager
def host_al(s: LabSession) -> Iterator[AccessLayer]:
    """ibal's rxe on the tap's address, in the lab's namespace."""
    with host_rxe(s) as mgr:
        yield mgr.open_al()


@pytest.mark.timeout(400)
def test_srp_initiator_against_ib_srpt(ibal_lab_module_net: LabSession) -> None:
    """Login, INQUIRY, READ CAPACITY, WRITE with a direct descriptor, READ back with an
    indirect table of four, a LUN reset, logout; the guest's backing file has the data."""
    s = ibal_lab_module_net
    tport = target_up(s)
    _, guest_ip = _addrs(s)
    data = random.Random(4).randbytes(16 * 1024)
    lba = 100
    with host_al(s) as al:
        with SrpInitiator(al, tport, INITIATOR, addr=guest_ip, port=PORT) as srp:
            assert srp.login["max_it_iu_len"] >= 64 and srp.credits > 0
            vendor, product = srp.inquiry()
            assert vendor == "LIO-ORG" and product
            assert srp.read_capacity() == ((MIB << 20) // BLOCK, BLOCK)
            srp.write(lba, data, BLOCK)
            assert srp.read(lba, len(data) // BLOCK, BLOCK, descriptors=4) == data
            srp.write(lba + 64, data[:2048], BLOCK, descriptors=2)
            assert srp.read(lba + 64, 4, BLOCK) == data[:2048]
            with pytest.raises(ScsiError) as ei:  # past the end: ILLEGAL REQUEST
                srp.read((MIB << 20) // BLOCK - 1, 2, BLOCK)
            assert ei.value.scsi_status == w.CHECK_CONDITION and ei.value.sense_key == 0x5
            assert srp.task_management(w.TSK_LUN_RESET) == 0
            assert srp.read(lba, 1, BLOCK) == data[:BLOCK]
        assert srp.owned() == []
    assert guest_sha(s, lba * BLOCK, len(data)) == hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(400)
def test_srp_login_with_wrong_target_port_is_rejected(ibal_lab_module_net: LabSession) -> None:
    s = ibal_lab_module_net
    tport = target_up(s)
    _, guest_ip = _addrs(s)
    with host_al(s) as al:
        with pytest.raises(SrpLoginRejected) as ei:
            SrpInitiator(al, bytes(16), INITIATOR, addr=guest_ip, port=PORT)
        assert ei.value.reason == w.LoginRejReason.UNABLE_ASSOCIATE_CHANNEL
        assert tport != bytes(16)


@pytest.mark.timeout(400)
def test_srp_target_found_through_pnp_dm(ibal_lab_module_net: LabSession) -> None:
    """The IBAL way: ib_srpt's DM agent answers IOC discovery over RoCE (IOUnitInfo,
    IOControllerProfile, ServiceEntries), the SRP IOC arrives as IOC_ADD and its path as
    IOC_PATH_ADD.  A login through the IB CM to the service ID its entry names is
    refused (REJ invalid service ID: ib_srpt listens on the IB CM on InfiniBand ports
    only); through the RDMA CM to the path's destination address it goes in."""
    s = ibal_lab_module_net
    tport = target_up(s)
    _, guest_ip = _addrs(s)
    events: queue.Queue[PnpRec] = queue.Queue()
    with host_al(s) as al:
        disc = Discovery.start(al.manager, interval=None, timeout=1.0, retries=2,
                               roce_peers=[RocePeer(Gid(f"::ffff:{guest_ip}"), desc="guest")])
        try:
            reg = al.reg_pnp(PnpClass.IOC, events.put)
            disc.sweep_now().wait(60)
            got: dict[PnpEvent, PnpRec] = {}
            while PnpEvent.IOC_PATH_ADD not in got:  # bounded by the queue's timeout
                rec = events.get(timeout=30)
                got.setdefault(rec.event, rec)
            ioc = got[PnpEvent.IOC_ADD].ioc
            assert ioc is not None
            prof = ioc.profile
            assert prof.id_string == "Linux SRP target" and prof.io_class == 0x0100  # SRP r16a
            (svc,) = ioc.svc_entries
            assert svc.name == "SRP.T10:" + tport[:8].hex() and svc.id == prof.ioc_guid
            assert w.target_port_id(svc.name, prof.ioc_guid) == tport
            path = got[PnpEvent.IOC_PATH_ADD].path
            assert path is not None
            with pytest.raises(SrpLoginRejected, match="INVALID_SERVICE_ID"):
                SrpInitiator.from_ioc(al, ioc, path, INITIATOR)
            with SrpInitiator.from_ioc(al, ioc, path, INITIATOR, rdma_port=PORT) as srp:
                assert srp.inquiry()[0] == "LIO-ORG"
                block = srp.read_capacity()[1]
                srp.write(200, b"found by DM".ljust(block, b"."), block)
                assert srp.read(200, 1, block).startswith(b"found by DM")
            assert srp.owned() == []
            reg.dereg()
        finally:
            disc.close()
    assert guest_sha(s, 200 * BLOCK, 11) == hashlib.sha256(b"found by DM").hexdigest()
