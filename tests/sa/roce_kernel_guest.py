"""Run inside the lab guest: one RoCE path resolved by ibal and by the kernel's rdma_cm.

``python3 roce_kernel_guest.py GUEST_IP HOST_IP`` prints one JSON line:
``ibal`` (the PathRecord fields ``ibal.sa.roce`` answers for the kernel rxe
port, its MAC, and the guest kernel's neighbour entry afterwards) and
``kernel`` (the path record librdmacm reports after ``rdma_resolve_addr`` and
``rdma_resolve_route`` between the same addresses, and the neighbour entry the
kernel learnt for it).  The neighbour table is flushed before each, so both
resolve the MAC from scratch.  librdmacm is bound with ctypes (no headers):
the layouts follow ``<rdma/rdma_cma.h>`` and ``<infiniband/sa.h>``.
"""

from __future__ import annotations

import ctypes
import json
import socket
import struct
import subprocess
import sys

U8, U16, U32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32


class PathRec(ctypes.Structure):
    """``struct ibv_sa_path_rec``."""

    _fields_ = [
        ("dgid", U8 * 16), ("sgid", U8 * 16), ("dlid", U16), ("slid", U16),
        ("raw_traffic", ctypes.c_int), ("flow_label", U32), ("hop_limit", U8),
        ("traffic_class", U8), ("reversible", ctypes.c_int), ("numb_path", U8), ("pkey", U16),
        ("sl", U8), ("mtu_selector", U8), ("mtu", U8), ("rate_selector", U8), ("rate", U8),
        ("packet_life_time_selector", U8), ("packet_life_time", U8), ("preference", U8),
    ]  # fmt: skip


class Gid(ctypes.Union):
    _fields_ = [("raw", U8 * 16), ("words", ctypes.c_uint64 * 2)]


class RouteHead(ctypes.Structure):
    """``struct rdma_cm_id`` up to ``route.num_paths``."""

    _fields_ = [
        ("verbs", ctypes.c_void_p), ("channel", ctypes.c_void_p), ("context", ctypes.c_void_p),
        ("qp", ctypes.c_void_p), ("src", U8 * 128), ("dst", U8 * 128), ("sgid", Gid),
        ("dgid", Gid), ("pkey", U16), ("path_rec", ctypes.POINTER(PathRec)),
        ("num_paths", ctypes.c_int),
    ]  # fmt: skip


class Event(ctypes.Structure):
    """``struct rdma_cm_event`` up to ``status``."""

    _fields_ = [("id", ctypes.c_void_p), ("listen_id", ctypes.c_void_p),
                ("event", ctypes.c_int), ("status", ctypes.c_int)]  # fmt: skip


ADDR_RESOLVED, ROUTE_RESOLVED, RDMA_PS_TCP = 0, 2, 0x0106


def _sockaddr_in(ip: str) -> ctypes.Array[ctypes.c_char]:
    raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 0) + socket.inet_aton(ip)
    return ctypes.create_string_buffer(raw.ljust(16, b"\0"), 16)


def _neigh(ip: str) -> str | None:
    out = subprocess.run(["ip", "-j", "neigh", "show", ip], capture_output=True, text=True)
    for n in json.loads(out.stdout or "[]"):
        if "lladdr" in n:
            return str(n["lladdr"])
    return None


def _flush() -> None:
    subprocess.run(["ip", "neigh", "flush", "all"], check=True)


def kernel_path(src: str, dst: str) -> dict[str, object]:
    subprocess.run(["modprobe", "rdma_ucm"], capture_output=True, check=False)
    cm = ctypes.CDLL("librdmacm.so.1", use_errno=True)
    cm.rdma_create_event_channel.restype = ctypes.c_void_p
    cm.rdma_create_id.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    cm.rdma_resolve_addr.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int]  # fmt: skip
    cm.rdma_resolve_route.argtypes = [ctypes.c_void_p, ctypes.c_int]
    cm.rdma_get_cm_event.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(Event))]
    cm.rdma_ack_cm_event.argtypes = [ctypes.POINTER(Event)]
    cm.rdma_destroy_id.argtypes = [ctypes.c_void_p]
    cm.rdma_destroy_event_channel.argtypes = [ctypes.c_void_p]
    ch = cm.rdma_create_event_channel()
    cid = ctypes.c_void_p()
    if not ch or cm.rdma_create_id(ch, ctypes.byref(cid), None, RDMA_PS_TCP):
        raise OSError(ctypes.get_errno(), "rdma_create_id")

    def expect(kind: int) -> None:
        ev = ctypes.POINTER(Event)()
        if cm.rdma_get_cm_event(ch, ctypes.byref(ev)):
            raise OSError(ctypes.get_errno(), "rdma_get_cm_event")
        got, status = ev.contents.event, ev.contents.status
        cm.rdma_ack_cm_event(ev)
        if got != kind or status:
            raise RuntimeError(f"rdma_cm event {got} status {status}, wanted {kind}")

    if cm.rdma_resolve_addr(cid, _sockaddr_in(src), _sockaddr_in(dst), 5000):
        raise OSError(ctypes.get_errno(), "rdma_resolve_addr")
    expect(ADDR_RESOLVED)
    if cm.rdma_resolve_route(cid, 5000):
        raise OSError(ctypes.get_errno(), "rdma_resolve_route")
    expect(ROUTE_RESOLVED)
    head = RouteHead.from_address(cid.value)  # type: ignore[arg-type]
    assert head.num_paths >= 1
    rec = head.path_rec[0]
    out: dict[str, object] = {
        name: (bytes(getattr(rec, name)).hex() if name in ("dgid", "sgid") else getattr(rec, name))
        for name, *_ in PathRec._fields_
    }
    for name in ("dlid", "slid", "pkey"):
        out[name] = socket.ntohs(int(out[name]))  # type: ignore[call-overload]
    out["flow_label"] = socket.ntohl(int(out["flow_label"]))  # type: ignore[call-overload]
    cm.rdma_destroy_id(cid)
    cm.rdma_destroy_event_channel(ch)
    return out


def ibal_path(src: str, dst: str) -> dict[str, object]:
    import ibal
    from ibal.sa.roce import RoceResolver
    from ibal.sa.roce_net import NetlinkIpStack
    from ibal.types import Gid as G
    from ibal.wire.mad import sa
    from ibal.wire.mad.consts import Method

    with ibal.open_al(providers=["rdma_core"]) as al, NetlinkIpStack() as net:
        ca = al.open_ca(al.get_ca_guids()[0])

        def port() -> ibal.types.PortAttr:
            return ca.query().ports[0]

        resolver = RoceResolver(port, net, al.timers.call_later)
        data = sa.PATH_RECORD.encode(dgid=G("::ffff:" + dst).packed, sgid=G("::ffff:" + src).packed)
        mask = sa.component_mask(sa.PATH_RECORD, ["dgid", "sgid"])
        answer = resolver.request(Method.GET, data, mask, callback=lambda a: None).wait(30)
        if answer.path is None:
            return {"status": answer.status.name, "reason": answer.detail}
        fields = {k: v.hex() if isinstance(v, bytes) else v for k, v in answer.path.record.items()}
        return {**fields, "dmac": answer.path.dmac.hex(), "netdev": answer.path.netdev,
                "port_active_mtu": int(port().active_mtu),
                "port_gids": [(e.index, str(e.gid), e.gid_type.value, e.netdev)
                              for e in port().gid_table]}  # fmt: skip


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    _flush()
    ours = ibal_path(src, dst)
    ours["neigh_after"] = _neigh(dst)
    _flush()
    kernel = kernel_path(src, dst)
    kernel["neigh_after"] = _neigh(dst)
    print(json.dumps({"ibal": ours, "kernel": kernel}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
