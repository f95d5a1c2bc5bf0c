"""Subnet management agents of the mock fabric: one per CA port and per switch.

An agent answers SubnGet and the SubnSet an SM uses (IBA vol. 1 14.2.5)
with the attribute tables of :mod:`ibal.wire.mad.smp`.  :func:`answer` takes an
SMP that reached the agent (LID-routed, or directed-route at the end of its
path: :mod:`ibal.providers.mock.smi` walks the path) and returns the GetResp;
the DR hop pointer and paths are the SMI's business.

A switch's port 0 is its management port: NodeInfo.LocalPortNum and
PortInfo (attribute modifier 0) say which port the SMP came in by, PortInfo
of port 0 carries the switch's LID, external ports carry LID 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock.topology import MockPort, Switch
from ibal.types import DEFAULT_PKEY, AsyncEvent, LinkState, Mtu
from ibal.wire.fields import FieldError
from ibal.wire.mad import smp
from ibal.wire.mad.consts import MadStatus, Method, MgmtClass, SmpAttr
from ibal.wire.mad.header import SMP_DATA, SMP_DATA_SIZE, respond

if TYPE_CHECKING:
    from ibal.providers.mock.ca import MockCa
    from ibal.providers.mock.fabric import MockFabric

Node = MockPort | Switch

PKEY_TABLE_CAP = 64
SWITCH_PKEYS = [DEFAULT_PKEY]
LFT_BLOCK = 64
PKEY_BLOCK = 32
RESP_TIME_VALUE = 0x10

_OK = MadStatus.SUCCESS
_INVALID = MadStatus.INVALID_FIELD
_UNSUPPORTED = MadStatus.METHOD_ATTR_UNSUPPORTED

Result = tuple[int, bytes | None]


def answer(fabric: MockFabric, node: Node, in_port: int, mad: bytes | bytearray) -> bytearray:
    """The GetResp of ``node``'s SMA to ``mad``, which came in by port ``in_port``."""
    base_ver, mgmt_class, class_ver, method = mad[0], mad[1], mad[2], mad[3]
    if mgmt_class not in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR) or (base_ver, class_ver) != (1, 1):
        return respond(mad, status=MadStatus.BAD_VERSION)
    if method not in (Method.GET, Method.SET):
        return respond(mad, status=MadStatus.METHOD_UNSUPPORTED)
    attr_id = int.from_bytes(mad[16:18], "big")
    attr_mod = int.from_bytes(mad[20:24], "big")
    data = bytes(mad[SMP_DATA : SMP_DATA + SMP_DATA_SIZE])
    try:
        if isinstance(node, Switch):
            status, out = _switch_attr(fabric, node, in_port, method, attr_id, attr_mod, data)
        else:
            status, out = _ca_attr(fabric, node, method, attr_id, attr_mod, data)
    except FieldError:  # a Set whose data does not decode
        status, out = _INVALID, None
    return respond(mad, status=status, data=out)


# ================================================================ attributes
def node_info(fabric: MockFabric, node: Node, in_port: int) -> bytes:
    if isinstance(node, Switch):
        return smp.NODE_INFO.encode(
            base_version=1, class_version=1, node_type=smp.NodeType.SWITCH,
            num_ports=node.num_ports, system_image_guid=node.guid, node_guid=node.guid,
            port_guid=node.guid, partition_cap=len(SWITCH_PKEYS), device_id=0xB924,
            revision=0xA0, local_port_num=in_port, vendor_id=_vendor(fabric),
        )  # fmt: skip
    ca = node.ca
    return smp.NODE_INFO.encode(
        base_version=1, class_version=1, node_type=smp.NodeType.CA, num_ports=len(ca.ports),
        system_image_guid=ca.system_image_guid, node_guid=ca.guid, port_guid=node.guid,
        partition_cap=PKEY_TABLE_CAP, device_id=ca.attr_device_id & 0xFFFF,
        revision=ca.attr_revision & 0xFFFFFFFF, local_port_num=node.num,
        vendor_id=ca.attr_vendor_id & 0xFFFFFF,
    )  # fmt: skip


def _vendor(fabric: MockFabric) -> int:
    from ibal.providers.mock.ca import MOCK_OUI

    return MOCK_OUI & 0xFFFFFF


def port_info(fabric: MockFabric, port: MockPort) -> bytes:
    """PortInfo of a CA port."""
    active = port.state is LinkState.ACTIVE
    return smp.PORT_INFO.encode(
        gid_prefix=port.subnet_prefix, lid=port.lid, master_sm_lid=fabric.sm_lid,
        capability_mask=int(port.cap) | _is_sm(fabric, port), local_port_num=port.num,
        **_link_fields(active, port.max_mtu), lmc=port.lmc & 7, init_type=port.init_type & 0xF,
        p_key_violations=port.pkey_violations, q_key_violations=port.qkey_violations,
        partition_enforcement_inbound=1, partition_enforcement_outbound=1,
        subnet_timeout=fabric.subnet_timeout & 0x1F,
    )  # fmt: skip


def _is_sm(fabric: MockFabric, port: MockPort) -> int:
    return int(smp.CapabilityMask.IS_SM) if port.lid == fabric.sm_lid and port.lid else 0


def _link_fields(active: bool, mtu: Mtu) -> dict[str, int]:
    """What CA and switch ports share: a 4X QDR link, its state, VL0 only."""
    return {
        "link_width_enabled": smp.LinkWidth.W4X,
        "link_width_supported": smp.LinkWidth.W1X | smp.LinkWidth.W4X,
        "link_width_active": smp.LinkWidth.W4X,
        "link_speed_supported": smp.LinkSpeed.SDR | smp.LinkSpeed.DDR | smp.LinkSpeed.QDR,
        "port_state": smp.PortState.ACTIVE if active else smp.PortState.DOWN,
        "port_phys_state": smp.PhysPortState.LINK_UP if active else smp.PhysPortState.POLLING,
        "link_down_default_state": smp.PhysPortState.POLLING,
        "link_speed_active": smp.LinkSpeed.QDR,
        "link_speed_enabled": smp.LinkSpeed.SDR | smp.LinkSpeed.DDR | smp.LinkSpeed.QDR,
        "neighbor_mtu": int(mtu),
        "vl_cap": 1,
        "mtu_cap": int(Mtu.MTU_4096),
        "vl_stall_count": 7,
        "hoq_life": 0x10,
        "operational_vls": 1,
        "guid_cap": 1,
        "resp_time_value": RESP_TIME_VALUE,
    }


def switch_port_info(fabric: MockFabric, sw: Switch, num: int, in_port: int = 0) -> bytes:
    """PortInfo of switch port ``num`` (0: the management port) to an SMP that came in by
    ``in_port``: LocalPortNum is that port whichever port is asked (IBA 14.2.5.6)."""
    if num == 0:
        return smp.PORT_INFO.encode(
            lid=sw.lid, master_sm_lid=fabric.sm_lid, local_port_num=in_port,
            **_link_fields(True, Mtu.MTU_4096),
            capability_mask=smp.CapabilityMask.IS_SYSTEM_IMAGE_GUID_SUPPORTED,
            subnet_timeout=fabric.subnet_timeout & 0x1F,
        )  # fmt: skip
    link = sw.port_links[num]
    fields = _link_fields(link is not None and link.up, Mtu.MTU_4096)
    fields["guid_cap"] = 0
    return smp.PORT_INFO.encode(local_port_num=in_port, **fields)


def sm_info(fabric: MockFabric, request: bytes) -> bytes:
    """SMInfo of the master SM: its SM_Key only for a requester that knows it."""
    sm = fabric.sm
    port = sm.port
    asked = smp.SM_INFO.decode(request)["sm_key"]
    return smp.SM_INFO.encode(
        guid=0 if port is None else port.guid, sm_key=sm.sm_key if asked == sm.sm_key else 0,
        act_count=sm.act_count & 0xFFFFFFFF, priority=sm.priority, sm_state=sm.state,
    )  # fmt: skip


def _pkey_block(keys: list[int], block: int) -> bytes:
    part = keys[block * PKEY_BLOCK : (block + 1) * PKEY_BLOCK]
    return b"".join(k.to_bytes(2, "big") for k in part)


# ===================================================================== CAs
def _ca_attr(
    fabric: MockFabric, port: MockPort, method: int, attr_id: int, attr_mod: int, data: bytes
) -> Result:
    ca = port.ca
    get = method == Method.GET
    if attr_id == SmpAttr.NODE_DESC:
        return (_OK, ca.description.encode()[:64]) if get else (_UNSUPPORTED, None)
    if attr_id == SmpAttr.NODE_INFO:
        return (_OK, node_info(fabric, port, port.num)) if get else (_UNSUPPORTED, None)
    if attr_id == SmpAttr.GUID_INFO:
        if not get:
            return _UNSUPPORTED, None
        return (_OK, port.guid.to_bytes(8, "big")) if attr_mod == 0 else (_INVALID, None)
    if attr_id == SmpAttr.PORT_INFO:
        target = port if attr_mod == 0 else ca.port_or_none(attr_mod)
        if target is None:
            return _INVALID, None
        if not get:
            status = _set_port_info(fabric, ca, target, data)
            if status:
                return status, None
        return _OK, port_info(fabric, target)
    if attr_id == SmpAttr.PKEY_TABLE:
        block = attr_mod & 0xFFFF
        if block * PKEY_BLOCK >= PKEY_TABLE_CAP:
            return _INVALID, None
        if not get:
            _set_pkeys(fabric, port, block, data)
        return _OK, _pkey_block(port.pkeys, block)
    if attr_id == SmpAttr.SM_INFO:
        if port.lid != fabric.sm_lid or not get:
            return _UNSUPPORTED, None
        return _OK, sm_info(fabric, data)
    return _UNSUPPORTED, None


def _set_port_info(fabric: MockFabric, ca: MockCa, port: MockPort, data: bytes) -> int:
    """Apply what an SM sets and the mock models: LID, SM LID, PortState, ClientReregister."""
    pi = smp.PORT_INFO.decode(data)
    old_sm_lid = fabric.sm_lid  # the SM's own port may be the one moving
    lid = int(pi["lid"])
    if lid and lid != port.lid:
        if lid > 0xBFFF or lid in fabric.used_lids():
            return _INVALID
        fabric.set_lid_locked(port, lid)
    sm_lid = int(pi["master_sm_lid"])
    if sm_lid and sm_lid != old_sm_lid:
        fabric.set_sm_lid_locked(sm_lid)
    state = pi["port_state"]
    if state == smp.PortState.DOWN and port.state is LinkState.ACTIVE:
        fabric.set_port_link_locked(port, False)
    elif state == smp.PortState.ACTIVE and port.state is not LinkState.ACTIVE and port.link:
        fabric.set_port_link_locked(port, True)
    if pi["client_reregister"]:
        fabric.port_event(port, AsyncEvent.CLIENT_REREGISTER)
    return _OK


def _set_pkeys(fabric: MockFabric, port: MockPort, block: int, data: bytes) -> None:
    keys = list(port.pkeys) + [0] * (PKEY_TABLE_CAP - len(port.pkeys))
    values = smp.PKEY_TABLE.unpack(data, 0)
    keys[block * PKEY_BLOCK : (block + 1) * PKEY_BLOCK] = [int(v) for v in values]
    while len(keys) > 1 and keys[-1] == 0:
        keys.pop()
    if keys != port.pkeys:
        port.pkeys[:] = keys
        fabric.port_event(port, AsyncEvent.PKEY_CHANGE)


# ================================================================ switches
def _switch_attr(
    fabric: MockFabric, sw: Switch, in_port: int, method: int, attr_id: int, attr_mod: int,
    data: bytes,
) -> Result:  # fmt: skip
    get = method == Method.GET
    if attr_id == SmpAttr.NODE_DESC:
        return (_OK, sw.description.encode()[:64]) if get else (_UNSUPPORTED, None)
    if attr_id == SmpAttr.NODE_INFO:
        return (_OK, node_info(fabric, sw, in_port)) if get else (_UNSUPPORTED, None)
    if attr_id == SmpAttr.GUID_INFO:
        if not get:
            return _UNSUPPORTED, None
        return (_OK, sw.guid.to_bytes(8, "big")) if attr_mod == 0 else (_INVALID, None)
    if attr_id == SmpAttr.SWITCH_INFO:
        if not get:
            return _UNSUPPORTED, None
        fabric.sm.refresh()
        return _OK, smp.SWITCH_INFO.encode(
            linear_fdb_cap=0xC000, linear_fdb_top=max(sw.lft, default=0),
            default_port=0, default_multicast_primary_port=0xFF,
            default_multicast_not_primary_port=0xFF, life_time_value=0x12, lids_per_port=1,
            partition_enforcement_cap=len(SWITCH_PKEYS), enhanced_port0=0,
        )  # fmt: skip
    if attr_id == SmpAttr.PORT_INFO:
        if attr_mod > sw.num_ports:
            return _INVALID, None
        if not get and attr_mod == 0:
            lid = int(smp.PORT_INFO.decode(data)["lid"])
            if lid and lid != sw.lid:
                if lid > 0xBFFF or lid in fabric.used_lids():
                    return _INVALID, None
                sw.lid = lid
                fabric.engine.topology_changed()
        return _OK, switch_port_info(fabric, sw, attr_mod, in_port)
    if attr_id == SmpAttr.PKEY_TABLE:
        port_num, block = attr_mod >> 16, attr_mod & 0xFFFF
        if port_num > sw.num_ports or block != 0:
            return _INVALID, None
        return (_OK, _pkey_block(SWITCH_PKEYS, 0)) if get else (_UNSUPPORTED, None)
    if attr_id == SmpAttr.LINEAR_FT:
        if attr_mod * LFT_BLOCK > 0xBFFF:
            return _INVALID, None
        fabric.sm.refresh()
        base = attr_mod * LFT_BLOCK
        if not get:
            for i, out in enumerate(data):
                if out != 0xFF:
                    sw.lft[base + i] = out
                else:
                    sw.lft.pop(base + i, None)
        return _OK, bytes(sw.lft.get(base + i, 0xFF) for i in range(LFT_BLOCK))
    return _UNSUPPORTED, None
