"""IBAL's C spellings (``ib_open_al``, ``ib_create_qp``, ...) as thin functions.

Each function checks the type of its handle argument first, so a wrong-type
handle raises that verb's ``Invalid*Handle`` (as the C API would for a bad
pointer), then calls the method.  Out-parameters are return values.  Passing
:data:`ib_sync_destroy` as a destroy callback makes the destroy blocking.

:data:`IBAL_MAPPING` lists every entry of the ``ib_al.h`` reference with its
ibal spelling and status; ``docs/mapping.md`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ibal.al.access_layer import AccessLayer
from ibal.al.alias import AliasQp
from ibal.al.av import Av
from ibal.al.ca import Ca
from ibal.al.cq import CompCallback, Cq
from ibal.al.fmr import Fmr
from ibal.al.manager import open_al
from ibal.al.mr import Mr, Mw
from ibal.al.obj import SYNC_DESTROY, AlObject, DestroyCallback, SyncDestroy
from ibal.al.pd import Pd
from ibal.al.pnp import PnpCallback, PnpClass, PnpRec, PnpRegistration
from ibal.al.qp import Qp, QpCreate
from ibal.al.srq import Srq
from ibal.cm.api import (
    cm_apr,
    cm_cancel,
    cm_drep,
    cm_dreq,
    cm_handoff,
    cm_lap,
    cm_listen,
    cm_mra,
    cm_rej,
    cm_rep,
    cm_req,
    cm_rtu,
    force_apm,
)
from ibal.dm.ioc import Ioc, SvcEntryHandle, create_ioc
from ibal.mad import (
    MadElement,
    MadPool,
    MadService,
    MadSvc,
    PoolKey,
    get_mad_buf,
    put_mad,
    reg_mad_svc,
)
from ibal.sa.inform import ib_subscribe as subscribe_req
from ibal.sa.inform import ib_unsubscribe as unsubscribe
from ibal.sa.mcast import join_mcast_req, leave_mcast
from ibal.sa.query import (
    cancel_query,
    get_query_node_rec,
    get_query_path_rec,
    get_query_portinfo_rec,
    get_query_result,
    get_query_svc_rec,
    query,
)
from ibal.sa.service import dereg_svc, reg_svc
from ibal.status import InvalidHandle, InvalidParameter
from ibal.types import (
    AccessFlags,
    AsyncEventRec,
    AvAttr,
    BindWr,
    CaAttr,
    CaMod,
    CiOp,
    DgrmInfo,
    FmrCreate,
    Gid,
    MrAttr,
    MrModMask,
    PdType,
    PhysCreate,
    PortAttrMod,
    QpAttr,
    QpMod,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    Wc,
)

ib_sync_destroy = SYNC_DESTROY
"""Pass as ``pfn_destroy_cb`` for a blocking destroy (``wait=True``)."""

EventCallback = Callable[[AsyncEventRec], object]
DestroyArg = DestroyCallback | SyncDestroy | None

_T = TypeVar("_T", bound=AlObject)


def _h(obj: object, cls: type[_T]) -> _T:
    """``obj`` if it is a ``cls``, else ``cls``'s ``Invalid*Handle`` (validity is the method's)."""
    if not isinstance(obj, cls):
        raise cls._invalid(f"expected a {cls._kind} handle, got {type(obj).__name__}")
    return obj


# ---------------------------------------------------------------------- AL and CA
def ib_open_al(
    providers: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
) -> AccessLayer:
    return open_al(providers)


def ib_close_al(h_al: AccessLayer) -> None:
    _h(h_al, AccessLayer).close()


def ib_get_ca_guids(h_al: AccessLayer) -> list[int]:
    return _h(h_al, AccessLayer).get_ca_guids()


def ib_open_ca(
    h_al: AccessLayer,
    ca_guid: int,
    pfn_ca_event_cb: EventCallback | None = None,
    ca_context: Any = None,
) -> Ca:
    return _h(h_al, AccessLayer).open_ca(ca_guid, event_cb=pfn_ca_event_cb, context=ca_context)


def ib_close_ca(h_ca: Ca, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_ca, Ca).close(pfn_destroy_cb)


def ib_query_ca(h_ca: Ca) -> CaAttr:
    return _h(h_ca, Ca).query()


def ib_query_ca_by_guid(h_al: AccessLayer, ca_guid: int) -> CaAttr:
    return _h(h_al, AccessLayer).query_ca_by_guid(ca_guid)


def ib_modify_ca(h_ca: Ca, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod) -> None:
    _h(h_ca, Ca).modify(port_num, ca_mod, port_attr_mod)


def ib_get_ca_by_gid(h_al: AccessLayer, gid: Gid) -> int:
    return _h(h_al, AccessLayer).get_ca_by_gid(gid)


def ib_get_port_by_gid(h_al: AccessLayer, gid: Gid) -> int:
    return _h(h_al, AccessLayer).get_port_by_gid(gid)


def ib_get_guid(h_al: AccessLayer, index: int, device_type: str, attr_mask: int = 0) -> int:
    return _h(h_al, AccessLayer).get_guid(index, device_type, attr_mask)


def ib_ci_call(h_ca: Ca, handle_array: Sequence[AlObject], ci_op: CiOp) -> CiOp:
    return _h(h_ca, Ca).ci_call(ci_op, handle_array)


def ib_local_mad(h_ca: Ca, port_num: int, mad_in: bytes) -> bytes:
    return _h(h_ca, Ca).local_mad(port_num, mad_in)


# ---------------------------------------------------------------------- SA service registration
def ib_reg_svc(h_al: AccessLayer, p_reg_svc_req: Any) -> Any:
    """``ibal.sa.reg_svc``: returns the ``ServiceRegistration`` (``h_reg_svc``)."""
    return reg_svc(_h(h_al, AccessLayer), p_reg_svc_req)


def ib_dereg_svc(h_reg_svc: Any, pfn_destroy_cb: DestroyArg = None) -> None:
    if isinstance(pfn_destroy_cb, SyncDestroy):
        dereg_svc(h_reg_svc, wait=True)
    else:
        dereg_svc(h_reg_svc, pfn_destroy_cb)


# ---------------------------------------------------------------------- SA queries
def ib_query(h_al: AccessLayer, p_query_req: Any) -> Any:
    """``ibal.sa.query``: returns the ``Query`` (``h_query``)."""
    return query(_h(h_al, AccessLayer), p_query_req)


def ib_cancel_query(h_al: AccessLayer, h_query: Any) -> None:
    cancel_query(_h(h_al, AccessLayer), h_query)


def ib_get_query_result(p_result_mad: bytes, result_index: int) -> bytes:
    return get_query_result(p_result_mad, result_index)


def ib_get_query_node_rec(p_result_mad: bytes, result_index: int) -> dict[str, Any]:
    return get_query_node_rec(p_result_mad, result_index)


def ib_get_query_path_rec(p_result_mad: bytes, result_index: int) -> dict[str, Any]:
    return get_query_path_rec(p_result_mad, result_index)


def ib_get_query_portinfo_rec(p_result_mad: bytes, result_index: int) -> dict[str, Any]:
    return get_query_portinfo_rec(p_result_mad, result_index)


def ib_get_query_svc_rec(p_result_mad: bytes, result_index: int) -> dict[str, Any]:
    return get_query_svc_rec(p_result_mad, result_index)


# ---------------------------------------------------------------------- IOC (ibal.dm)
def _ioc(h_ioc: object) -> Any:
    if not isinstance(h_ioc, Ioc):
        raise InvalidHandle(f"expected an IOC handle, got {type(h_ioc).__name__}")
    return h_ioc


def ib_create_ioc(h_ca: Ca, p_ioc_profile: Any) -> Any:
    """``ibal.dm.create_ioc``: returns the ``Ioc`` (``h_ioc``)."""
    return create_ioc(h_ca, p_ioc_profile)


def ib_destroy_ioc(h_ioc: Any) -> None:
    _ioc(h_ioc).destroy()


def ib_reg_ioc(h_ioc: Any) -> None:
    _ioc(h_ioc).register()


def ib_add_svc_entry(h_ioc: Any, p_svc_entry: Any) -> Any:
    """Returns the ``SvcEntryHandle`` (``h_svc``)."""
    return _ioc(h_ioc).add_svc_entry(p_svc_entry)


def ib_remove_svc_entry(h_svc: Any) -> None:
    if not isinstance(h_svc, SvcEntryHandle):
        raise InvalidHandle(f"expected a service entry handle, got {type(h_svc).__name__}")
    h_svc.remove()


# ---------------------------------------------------------------------- MAD pools and services
def _pool(h_pool: object) -> MadPool:
    if not isinstance(h_pool, MadPool):
        raise InvalidHandle(f"expected a MAD pool handle, got {type(h_pool).__name__}")
    return h_pool


def _key(pool_key: object) -> PoolKey:
    if not isinstance(pool_key, PoolKey):
        raise InvalidParameter(f"expected a pool key, got {type(pool_key).__name__}")
    return pool_key


def _svc(h_mad_svc: object) -> MadService:
    if not isinstance(h_mad_svc, MadService):
        raise InvalidHandle(f"expected a MAD service handle, got {type(h_mad_svc).__name__}")
    return h_mad_svc


def ib_create_mad_pool(h_al: AccessLayer, min: int, max: int, grow_size: int) -> MadPool:
    return MadPool(_h(h_al, AccessLayer), min, max, grow_size)


def ib_destroy_mad_pool(h_pool: MadPool) -> None:
    _pool(h_pool).destroy()


def ib_reg_mad_pool(h_pool: MadPool, h_pd: Pd) -> PoolKey:
    return _pool(h_pool).register(_h(h_pd, Pd))


def ib_dereg_mad_pool(pool_key: PoolKey) -> None:
    _key(pool_key).dereg()


def ib_get_mad(pool_key: PoolKey, buf_size: int) -> MadElement:
    return _key(pool_key).get_mad(buf_size)


def ib_put_mad(p_mad_element_list: MadElement | Sequence[MadElement]) -> None:
    put_mad(p_mad_element_list)


def ib_get_mad_buf(p_mad_element: MadElement) -> bytearray:
    return get_mad_buf(p_mad_element)


# ---------------------------------------------------------------------- SA services
def ib_join_mcast(h_qp: Qp, p_mcast_req: Any) -> Any:
    """``ibal.sa.join_mcast_req``: returns the ``McastMembership`` (``h_mcast``)."""
    return join_mcast_req(_h(h_qp, Qp), p_mcast_req)


def ib_leave_mcast(h_mcast: Any, pfn_destroy_cb: DestroyArg = None) -> None:
    if isinstance(pfn_destroy_cb, SyncDestroy):
        leave_mcast(h_mcast, wait=True)
    else:
        leave_mcast(h_mcast, pfn_destroy_cb)


def ib_reg_mad_svc(h_qp: AliasQp, p_mad_svc: MadSvc, pool_key: PoolKey | None = None
                   ) -> MadService:
    if not isinstance(h_qp, AliasQp):
        raise InvalidParameter("MAD services live on QP0/QP1 alias QPs")
    return reg_mad_svc(h_qp, p_mad_svc, pool_key)


def ib_send_mad(h_mad_svc: MadService, p_mad_element_list: MadElement | Sequence[MadElement]
                ) -> None:
    _svc(h_mad_svc).send(p_mad_element_list)


def ib_cancel_mad(h_mad_svc: MadService, p_mad_element: MadElement) -> None:
    _svc(h_mad_svc).cancel(p_mad_element)


# ---------------------------------------------------------------------- PD and AV
def ib_alloc_pd(h_ca: Ca, pd_type: PdType = PdType.NORMAL, pd_context: Any = None) -> Pd:
    return _h(h_ca, Ca).alloc_pd(pd_type, context=pd_context)


def ib_dealloc_pd(h_pd: Pd, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_pd, Pd).dealloc(pfn_destroy_cb)


def ib_create_av(h_pd: Pd, av_attr: AvAttr) -> Av:
    return _h(h_pd, Pd).create_av(av_attr)


def ib_query_av(h_av: Av) -> tuple[AvAttr, Pd]:
    av = _h(h_av, Av)
    return av.query(), av.pd


def ib_modify_av(h_av: Av, av_attr: AvAttr) -> None:
    _h(h_av, Av).modify(av_attr)


def ib_destroy_av(h_av: Av) -> None:
    _h(h_av, Av).destroy()


# ---------------------------------------------------------------------- CQ
def ib_create_cq(
    h_ca: Ca,
    size: int,
    pfn_comp_cb: CompCallback | None = None,
    cq_context: Any = None,
    pfn_cq_event_cb: EventCallback | None = None,
) -> Cq:
    return _h(h_ca, Ca).create_cq(
        size, comp_cb=pfn_comp_cb, event_cb=pfn_cq_event_cb, context=cq_context
    )


def ib_query_cq(h_cq: Cq) -> int:
    return _h(h_cq, Cq).query()


def ib_modify_cq(h_cq: Cq, size: int) -> int:
    return _h(h_cq, Cq).modify(size)


def ib_destroy_cq(h_cq: Cq, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_cq, Cq).destroy(pfn_destroy_cb)


def ib_poll_cq(h_cq: Cq, max_entries: int = 16) -> list[Wc]:
    return _h(h_cq, Cq).poll(max_entries)


def ib_peek_cq(h_cq: Cq) -> int:
    return _h(h_cq, Cq).peek()


def ib_rearm_cq(h_cq: Cq, solicited: bool = False) -> None:
    _h(h_cq, Cq).rearm(solicited)


def ib_rearm_n_cq(h_cq: Cq, n_cqes: int) -> None:
    _h(h_cq, Cq).rearm_n(n_cqes)


# ---------------------------------------------------------------------- QP
def ib_create_qp(
    h_pd: Pd,
    qp_create: QpCreate,
    qp_context: Any = None,
    pfn_qp_event_cb: EventCallback | None = None,
) -> Qp:
    return _h(h_pd, Pd).create_qp(qp_create, context=qp_context, event_cb=pfn_qp_event_cb)


def ib_get_spl_qp(
    h_pd: Pd,
    port_guid: int,
    qp_create: QpCreate,
    qp_context: Any = None,
    pfn_qp_event_cb: EventCallback | None = None,
) -> Qp | AliasQp:
    pd = _h(h_pd, Pd)
    if isinstance(qp_create, QpCreate) and qp_create.qp_type in (
        QpType.QP0_ALIAS, QpType.QP1_ALIAS
    ):  # IBAL passes the create record for aliases too; its CQs are not used
        return pd.get_spl_qp(port_guid, QpType(qp_create.qp_type), context=qp_context)
    return pd.get_spl_qp(port_guid, qp_create, context=qp_context, event_cb=pfn_qp_event_cb)


def ib_query_qp(h_qp: Qp) -> QpAttr:
    return _h(h_qp, Qp).query()


def ib_modify_qp(h_qp: Qp, qp_mod: QpMod) -> None:
    _h(h_qp, Qp).modify(qp_mod)


def ib_destroy_qp(h_qp: Qp, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_qp, Qp).destroy(pfn_destroy_cb)


def ib_init_dgrm_svc(h_qp: Qp, dgrm_info: DgrmInfo | None = None) -> None:
    _h(h_qp, Qp).init_dgrm_svc(dgrm_info)


def ib_post_send(h_qp: Qp, send_wr: SendWr | Sequence[SendWr]) -> None:
    _h(h_qp, Qp).post_send(send_wr)


def ib_post_recv(h_qp: Qp, recv_wr: RecvWr | Sequence[RecvWr]) -> None:
    _h(h_qp, Qp).post_recv(recv_wr)


# ---------------------------------------------------------------------- SRQ
def ib_create_srq(
    h_pd: Pd,
    srq_attr: SrqAttr,
    srq_context: Any = None,
    pfn_srq_event_cb: EventCallback | None = None,
) -> Srq:
    return _h(h_pd, Pd).create_srq(srq_attr, context=srq_context, event_cb=pfn_srq_event_cb)


def ib_query_srq(h_srq: Srq) -> SrqAttr:
    return _h(h_srq, Srq).query()


def ib_modify_srq(h_srq: Srq, srq_attr: SrqAttr, srq_attr_mask: SrqAttrMask) -> None:
    _h(h_srq, Srq).modify(srq_attr, srq_attr_mask)


def ib_destroy_srq(h_srq: Srq, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_srq, Srq).destroy(pfn_destroy_cb)


def ib_post_srq_recv(h_srq: Srq, recv_wr: RecvWr | Sequence[RecvWr]) -> None:
    _h(h_srq, Srq).post_recv(recv_wr)


# ---------------------------------------------------------------------- MR and MW
def ib_reg_mem(h_pd: Pd, buffer: object, access_ctrl: AccessFlags) -> Mr:
    """The region's ``lkey``/``rkey``/``vaddr`` are attributes of the returned ``Mr``."""
    return _h(h_pd, Pd).reg_mem(buffer, access_ctrl)


def ib_reg_phys(h_pd: Pd, phys_create: PhysCreate, vaddr: int = 0) -> Mr:
    return _h(h_pd, Pd).reg_phys(phys_create, vaddr)


def ib_reg_shared(h_mr: Mr, h_pd: Pd, access_ctrl: AccessFlags, vaddr: int = 0) -> Mr:
    return _h(h_mr, Mr).reg_shared(_h(h_pd, Pd), access_ctrl, vaddr)


def ib_query_mr(h_mr: Mr) -> MrAttr:
    return _h(h_mr, Mr).query()


def ib_rereg_mem(
    h_mr: Mr,
    mr_mod_mask: MrModMask,
    buffer: object = None,
    access_ctrl: AccessFlags | None = None,
    h_pd: Pd | None = None,
) -> None:
    _h(h_mr, Mr).rereg(
        mr_mod_mask, buffer=buffer, access=access_ctrl,
        pd=_h(h_pd, Pd) if h_pd is not None else None,
    )


def ib_rereg_phys(
    h_mr: Mr,
    mr_mod_mask: MrModMask,
    phys_create: PhysCreate | None = None,
    vaddr: int = 0,
    h_pd: Pd | None = None,
) -> None:
    """The assigned address is ``h_mr.vaddr`` afterwards, the new keys ``lkey``/``rkey``."""
    _h(h_mr, Mr).rereg_phys(
        mr_mod_mask, phys_create, vaddr=vaddr, pd=_h(h_pd, Pd) if h_pd is not None else None
    )


def ib_reg_shmid(
    h_pd: Pd, shmid: str | bytes, access_ctrl: AccessFlags, length: int | None = None
) -> Mr:
    """``shmid`` names a POSIX shared-memory segment (``ib_shmid_t``: at most 64 bytes)."""
    return _h(h_pd, Pd).reg_shmid(shmid, access_ctrl, length)


def ib_dereg_mr(h_mr: Mr) -> None:
    _h(h_mr, Mr).dereg()


# ---------------------------------------------------------------------- FMR (Mellanox)
def mlnx_create_fmr(h_pd: Pd, fmr_create: FmrCreate) -> Fmr:
    return _h(h_pd, Pd).create_fmr(fmr_create)


def mlnx_map_phys_fmr(h_fmr: Fmr, page_list: Sequence[object], vaddr: int = 0) -> tuple[int, int]:
    """``(lkey, rkey)``; the assigned address is ``h_fmr.vaddr``."""
    return _h(h_fmr, Fmr).map(page_list, vaddr)


mlnx_map_fmr = mlnx_map_phys_fmr  # the reference's entry name; its synopsis says map_phys


def mlnx_unmap_fmr(h_fmr: Fmr) -> None:
    _h(h_fmr, Fmr).unmap()


def mlnx_destroy_fmr(h_fmr: Fmr) -> None:
    _h(h_fmr, Fmr).destroy()


def ib_create_mw(h_pd: Pd) -> Mw:
    """The window's R_KEY is ``mw.rkey``."""
    return _h(h_pd, Pd).create_mw()


def ib_query_mw(h_mw: Mw) -> tuple[Pd, int]:
    return _h(h_mw, Mw).query()


def ib_bind_mw(h_mw: Mw, h_qp: Qp, mw_bind: BindWr) -> int:
    return _h(h_mw, Mw).bind(_h(h_qp, Qp), mw_bind)


def ib_destroy_mw(h_mw: Mw) -> None:
    _h(h_mw, Mw).destroy()


# ---------------------------------------------------------------------- PnP
def ib_reg_pnp(
    h_al: AccessLayer,
    pnp_class: PnpClass | int,
    pfn_pnp_cb: PnpCallback,
    pnp_context: Any = None,
) -> PnpRegistration:
    return _h(h_al, AccessLayer).reg_pnp(pnp_class, pfn_pnp_cb, pnp_context)


def ib_dereg_pnp(h_pnp: PnpRegistration, pfn_destroy_cb: DestroyArg = None) -> None:
    _h(h_pnp, PnpRegistration).dereg(pfn_destroy_cb)


def ib_reject_ioc(h_al: AccessLayer, h_ioc_event: PnpRec) -> None:
    """``h_ioc_event`` is the :class:`PnpRec` of the ``IOC_ADD`` callback running."""
    _h(h_al, AccessLayer).reject_ioc(h_ioc_event)


# ---------------------------------------------------------------------- SA subscriptions
def ib_subscribe(h_al: AccessLayer, p_sub_req: Any) -> Any:
    """``ibal.sa.ib_subscribe``: returns the ``Subscription`` (``h_sub``)."""
    return subscribe_req(_h(h_al, AccessLayer), p_sub_req)


def ib_unsubscribe(h_sub: Any, pfn_destroy_cb: DestroyArg = None) -> None:
    if isinstance(pfn_destroy_cb, SyncDestroy):
        unsubscribe(h_sub, wait=True)
    else:
        unsubscribe(h_sub, pfn_destroy_cb)


def ib_cm_listen(h_al: AccessLayer, p_cm_listen: Any, pfn_listen_err_cb: Any,
                 listen_context: Any = None) -> Any:  # fmt: skip
    """``ibal.cm.api.cm_listen``: returns the listen handle (``h_cm_listen``)."""
    return cm_listen(_h(h_al, AccessLayer), p_cm_listen, pfn_listen_err_cb, listen_context)


def ib_cm_cancel(h_cm_listen: Any, pfn_destroy_cb: DestroyArg = None) -> None:
    cm_cancel(h_cm_listen, None if isinstance(pfn_destroy_cb, SyncDestroy) else pfn_destroy_cb)


def ib_cm_req(p_cm_req: Any) -> Any:
    """``ibal.cm.api.cm_req``: returns the connection handle."""
    return cm_req(p_cm_req)


def ib_cm_rep(h_cm_req: Any, p_cm_rep: Any) -> None:
    cm_rep(h_cm_req, p_cm_rep)


def ib_cm_rtu(h_cm_rep: Any, p_cm_rtu: Any) -> None:
    cm_rtu(h_cm_rep, p_cm_rtu)


def ib_cm_rej(h_cm: Any, p_cm_rej: Any) -> None:
    cm_rej(h_cm, p_cm_rej)


def ib_cm_mra(h_cm: Any, p_cm_mra: Any) -> None:
    cm_mra(h_cm, p_cm_mra)


def ib_cm_handoff(h_cm_req: Any, svc_id: int) -> Any:
    return cm_handoff(h_cm_req, svc_id)


def ib_cm_dreq(p_cm_dreq: Any) -> None:
    cm_dreq(p_cm_dreq)


def ib_cm_drep(h_cm_dreq: Any, p_cm_drep: Any) -> None:
    cm_drep(h_cm_dreq, p_cm_drep)


def ib_cm_lap(p_cm_lap: Any) -> None:
    cm_lap(p_cm_lap)


def ib_cm_apr(h_cm_lap: Any, p_cm_apr: Any) -> None:
    cm_apr(h_cm_lap, p_cm_apr)


def ib_force_apm(h_qp: Qp) -> None:
    force_apm(_h(h_qp, Qp))


# ---------------------------------------------------------------------- the mapping
_DONE: dict[str, str] = {
    "InfiniBand Access Layer": "ibal.al",
    "ib_open_al": "ibal.open_al() / AlManager.open_al()",
    "ib_close_al": "al.close()",
    "ib_open_ca": "al.open_ca(guid, event_cb=, context=)",
    "ib_close_ca": "ca.close(destroy_cb, wait=)",
    "ib_query_ca": "ca.query() -> CaAttr (no size probe: Python returns objects)",
    "ib_query_ca_by_guid": "al.query_ca_by_guid(guid)",
    "ib_modify_ca": "ca.modify(port_num, ca_mod, port_attr_mod)",
    "ib_get_ca_guids": "al.get_ca_guids() (no count probe: Python returns lists)",
    "ib_get_ca_by_gid": "al.get_ca_by_gid(gid)",
    "ib_get_port_by_gid": "al.get_port_by_gid(gid)",
    "ib_reg_svc": "ibal.sa.register_service(al, name=, service_id=, lease=, ...) -> "
    "ServiceRegistration (.wait(), await); ibal.sa.reg_svc(al, RegSvcReq)",
    "ib_dereg_svc": "registration.dereg(destroy_cb, wait=) (ibal.sa.dereg_svc)",
    "ib_reg_svc_req_t": "ibal.sa.RegSvcReq (svc_rec: ibal.sa.ServiceRecord; flags SYNC)",
    "_ib_reg_svc_rec_t": "ibal.sa.RegSvcRec (reg = h_reg_svc; attempt: register/renew/reregister)",
    "ib_pfn_reg_svc_cb_t": "callback(RegSvcRec) on the AL's misc queue, also for failed renewals",
    "ib_query": "ibal.sa.query(al, QueryReq) -> Query; Pythonic: ibal.sa.node_records, "
    "path_records, port_info_records, service_records, user_query (blocking, callback=, *_async)",
    "ib_cancel_query": "query.cancel() (ibal.sa.cancel_query(al, query)): the callback runs "
    "once, CANCELED",
    "ib_query_req_t": "ibal.sa.QueryReq (flags: ibal.types.AlFlags.SYNC)",
    "ib_query_rec_t": "ibal.sa.QueryRec (result_mad: the answer as bytes, no ib_put_mad)",
    "ib_query_type_t": "ibal.sa.QueryType",
    "ib_user_query_t": "ibal.sa.UserQuery (attr: the record as bytes)",
    "ib_pfn_query_cb_t": "QueryReq.callback(QueryRec) on the AL's misc queue",
    "ib_guid_pair_t": "ibal.sa.GuidPair",
    "ib_gid_pair_t": "ibal.sa.GidPair",
    "ib_lid_pair_t": "ibal.sa.LidPair",
    "ib_get_query_result": "ibal.sa.get_query_result(mad, i) -> bytes (InvalidIndex past the end)",
    "ib_get_query_node_rec": "ibal.sa.get_query_node_rec(mad, i) -> dict (attr_id checked)",
    "ib_get_query_path_rec": "ibal.sa.get_query_path_rec(mad, i) -> dict (attr_id checked)",
    "ib_get_query_portinfo_rec": "ibal.sa.get_query_portinfo_rec(mad, i) -> dict "
    "(attr_id checked)",
    "ib_get_query_svc_rec": "ibal.sa.get_query_svc_rec(mad, i) -> dict (attr_id checked)",
    "DAPL Address Translation Service": "ibal.sa.ats: ATS_SERVICE_ID, ATS_NAME, "
    "ATS_IPV4_OFFSET; register_address(al, ip), lookup_address(al, ip) -> [Gid]",
    "ib_create_ioc": "ibal.dm.create_ioc(ca, IocProfile) -> Ioc (dies with its CA handle)",
    "ib_destroy_ioc": "ioc.destroy(): unexported and its service entries removed on return",
    "ib_reg_ioc": "ioc.register() -> slot: exported by the DM agent of the CA's ports",
    "ib_add_svc_entry": "ioc.add_svc_entry(SvcEntry) -> SvcEntryHandle",
    "ib_remove_svc_entry": "svc_entry_handle.remove()",
    "ib_get_guid": "al.get_guid(index, device_type, attr_mask)",
    "ib_device_attr_mask_t": "ibal.al.DeviceAttrMask",
    "ib_ci_call": "ca.ci_call(op, handles)",
    "ib_alloc_pd": "ca.alloc_pd(pd_type, context=)",
    "ib_dealloc_pd": "pd.dealloc(destroy_cb, wait=)",
    "ib_create_av": "pd.create_av(attr)",
    "ib_query_av": "av.query(), av.pd",
    "ib_modify_av": "av.modify(attr)",
    "ib_destroy_av": "av.destroy()",
    "ib_cq_create_t": "ca.create_cq(size, comp_cb=) arguments",
    "ib_create_cq": "ca.create_cq(size, comp_cb=, event_cb=, context=)",
    "ib_query_cq": "cq.query()",
    "ib_modify_cq": "cq.modify(size)",
    "ib_destroy_cq": "cq.destroy(destroy_cb, wait=)",
    "ib_pfn_comp_cb_t": "comp_cb(cq, context)",
    "ib_poll_cq": "cq.poll(max_entries) (empty list = IB_NOT_FOUND)",
    "ib_peek_cq": "cq.peek()",
    "ib_rearm_cq": "cq.rearm(solicited)",
    "ib_rearm_n_cq": "cq.rearm_n(n)",
    "ib_create_qp": "pd.create_qp(QpCreate, context=, event_cb=)",
    "ib_query_qp": "qp.query()",
    "ib_modify_qp": "qp.modify(QpMod)",
    "ib_destroy_qp": "qp.destroy(destroy_cb, wait=)",
    "ib_create_srq": "pd.create_srq(attr, context=, event_cb=)",
    "ib_query_srq": "srq.query()",
    "ib_modify_srq": "srq.modify(attr, mask)",
    "ib_destroy_srq": "srq.destroy(destroy_cb, wait=)",
    "ib_post_srq_recv": "srq.post_recv(wrs)",
    "ib_post_send": "qp.post_send(wrs) (PostError.failed_index); also verbs' SEND_WITH_INV, "
    "LOCAL_INV, BIND_MW (WrType, SendWr.invalidate_rkey/mw/bind)",
    "ib_post_recv": "qp.post_recv(wrs)",
    "ib_reg_mem": "pd.reg_mem(buffer, access)",
    "ib_reg_phys": "pd.reg_phys(PhysCreate, vaddr)",
    "ib_reg_shared": "mr.reg_shared(pd, access, vaddr)",
    "ib_query_mr": "mr.query()",
    "ib_rereg_mem": "mr.rereg(mask, buffer=, access=, pd=)",
    "ib_rereg_phys": "mr.rereg_phys(mask, PhysCreate, vaddr=, pd=) (modify_pmr; with phys_mr)",
    "ib_reg_shmid": "pd.reg_shmid(shmid, access, length) (a POSIX shared-memory segment, "
    "mapped by the AL and registered with register_mr)",
    "ib_shmid_t": "str or bytes: the segment's name (multiprocessing.shared_memory), <= 64 bytes",
    "mlnx_create_fmr": "pd.create_fmr(FmrCreate(max_pages, max_maps, page_size, access)) "
    "(the CA's FMR verbs, else the AL's emulation over register/deregister)",
    "mlnx_map_fmr": "fmr.map(pages, vaddr) -> (lkey, rkey) (mlnx_map_phys_fmr; new keys per map)",
    "mlnx_unmap_fmr": "fmr.unmap()",
    "mlnx_destroy_fmr": "fmr.destroy() (ResourceBusy while mapped)",
    "ib_dereg_mr": "mr.dereg()",
    "ib_create_mw": "pd.create_mw() (mw_type=2: verbs' type 2 window)",
    "ib_query_mw": "mw.query() -> (pd, rkey)",
    "ib_bind_mw": "mw.bind(qp, BindWr)",
    "ib_destroy_mw": "mw.destroy()",
    "ib_get_spl_qp": "pd.get_spl_qp(port_guid, QpCreate | QpType.QP1_ALIAS, context=)",
    "ib_init_dgrm_svc": "qp.init_dgrm_svc(DgrmInfo)",
    "ib_dgrm_info_t": "ibal.types.DgrmInfo",
    "ib_local_mad": "ca.local_mad(port_num, mad); ibal.mad.local_mad(ca, port_num, element)",
    "ib_create_mad_pool": "ibal.mad.MadPool(al, min_count, max_count, grow_size)",
    "ib_destroy_mad_pool": "pool.destroy()",
    "ib_reg_mad_pool": "pool.register(pd) -> PoolKey",
    "ib_dereg_mad_pool": "pool_key.dereg()",
    "ib_get_mad": "pool_key.get_mad(size) -> MadElement",
    "ib_put_mad": "ibal.mad.put_mad(element | elements)",
    "ib_get_mad_buf": "element.mad (ibal.mad.get_mad_buf)",
    "ib_mad_element_t": "ibal.mad.MadElement",
    "ib_mad_svc_t": "ibal.mad.MadSvc",
    "ib_mad_svc_type_t": "ibal.mad.MadSvcType",
    "ib_reg_mad_svc": "ibal.mad.reg_mad_svc(alias_qp, MadSvc, pool_key=) -> MadService",
    "ib_send_mad": "service.send(element | elements)",
    "ib_cancel_mad": "service.cancel(element)",
    "ib_pfn_mad_comp_cb_t": "MadSvc.send_cb(element) / MadSvc.recv_cb(element)",
    "ib_reg_pnp": "al.reg_pnp(pnp_class, callback, context, order=PnpOrder.USER)",
    "ib_dereg_pnp": "registration.dereg(destroy_cb, wait=) / await registration.destroy_async()",
    "ib_pnp_req_t": "al.reg_pnp(pnp_class, callback, context) arguments",
    "ib_pnp_class_t": "ibal.al.PnpClass",
    "ib_pnp_event_t": "ibal.al.PnpEvent",
    "ib_pnp_rec_t": "ibal.al.PnpRec",
    "ib_pnp_ca_rec_t": "ibal.al.PnpRec (ca_attr)",
    "ib_pnp_port_rec_t": "ibal.al.PnpRec (ca_attr, port_attr)",
    "ib_pfn_pnp_cb_t": "callback(PnpRec) -> None | Status",
    "ib_pnp_iou_rec_t": "ibal.al.PnpRec (iou: ibal.types.IouInfo: guid, ca_guid, chassis_guid, "
    "slot, vend_id, dev_id, revision, desc)",
    "ib_pnp_ioc_rec_t": "ibal.al.PnpRec (ca_guid, ioc: ibal.types.IocInfo: profile, IOU, "
    "svc_entries)",
    "ib_pnp_ioc_path_rec_t": "ibal.al.PnpRec (ca_guid, port_guid, path: 64-byte PathRecord, ioc)",
    "ib_reject_ioc": "al.reject_ioc(rec) inside the IOC_ADD callback",
    "ib_async_event_rec_t": "ibal.types.AsyncEventRec",
    "ib_pfn_event_cb_t": "event_cb(AsyncEventRec)",
    "ib_pfn_destroy_cb_t": "destroy_cb(context)",
    "ib_sync_destroy": "wait=True (ibal.compat.ib_sync_destroy)",
    "ib_subscribe": "ibal.sa.subscribe(al, trap, port_guid, ...) -> Subscription / "
    "ibal.sa.ib_subscribe(al, SubReq)",
    "ib_unsubscribe": "sub.unsubscribe(destroy_cb, wait=) / ibal.sa.ib_unsubscribe(sub, cb)",
    "ib_sub_req_t": "ibal.sa.SubReq (inform_info: ibal.sa.InformInfo)",
    "ib_sub_rec_t": "ibal.sa.SubRec (context, status, subscription, error_status)",
    "ib_pfn_sub_cb_t": "callback(SubRec)",
    "ib_report_rec_t": "ibal.sa.ReportRec (context, notice: ibal.sa.Notice)",
    "ib_pfn_report_cb_t": "report_cb(ReportRec)",
    "ib_join_mcast": "ibal.sa.join_mcast(qp or (ca, port_num), mgid, join_state=, create=, "
    "callback=) -> McastMembership (.wait(), await; IB_FLAGS_SYNC: .wait())",
    "ib_leave_mcast": "membership.leave(destroy_cb, wait=) (ibal.sa.leave_mcast)",
    "ib_mcast_req_t": "ibal.sa.McastReq (sync = IB_FLAGS_SYNC) for "
    "ibal.sa.join_mcast_req(qp, req); or join_mcast's keyword arguments",
    "ib_mcast_rec_t": "ibal.sa.McastRec (membership = h_mcast, member_rec = ibal.sa.MemberRec)",
    "ib_pfn_mcast_cb_t": "callback(McastRec) on the AL's misc queue, also for rejoins "
    "(McastRec.rejoin)",
}

_CM_TYPES = {
    "ib_apr_info_t", "ib_apr_pdata_t", "ib_ari_t", "ib_cep_listen_t", "ib_drep_pdata_t",
    "ib_dreq_pdata_t", "ib_lap_pdata_t", "ib_listen_err_rec_t", "ib_listen_info_t",
    "ib_mra_pdata_t", "ib_rej_pdata_t", "ib_rep_pdata_t", "ib_req_pdata_t", "ib_rtu_pdata_t",
    "ib_sidr_rep_pdata_t", "ib_sidr_req_pdata_t", "ib_force_apm", "ib_al_flags_t",
    "ib_pfn_listen_err_cb_t",
}
# The CM's records and constants (ibal.cm.records; the calls are ibal.cm's API).
_CM_RECORDS = {
    "ib_al_flags_t": "ibal.cm.records.AlFlags (SYNC); ibal.sa requests take sync=True",
    "ib_cm_listen_t": "ibal.cm.records.CmListen",
    "ib_cep_listen_t": "ibal.cm.records.CepListen",
    "ib_listen_info_t": "ibal.cm.records.ALL_CAS, ALL_PORTS, ALL_LIDS, ALL_PKEYS",
    "ib_listen_err_rec_t": "ibal.cm.records.ListenErrRec",
    "ib_cm_req_t": "ibal.cm.records.CmReq (UD qp_type: SIDR)",
    "ib_cm_req_rec_t": "ibal.cm.records.CmReqRec",
    "ib_cm_rep_t": "ibal.cm.records.CmRep (UD qp_type: SIDR reply)",
    "ib_cm_rep_rec_t": "ibal.cm.records.CmRepRec (+ cm_status for the timeout)",
    "ib_cm_rtu_t": "ibal.cm.records.CmRtu",
    "ib_cm_rtu_rec_t": "ibal.cm.records.CmRtuRec (+ cm_status)",
    "ib_cm_rej_t": "ibal.cm.records.CmRej",
    "ib_cm_rej_rec_t": "ibal.cm.records.CmRejRec",
    "ib_cm_mra_t": "ibal.cm.records.CmMra",
    "ib_cm_mra_rec_t": "ibal.cm.records.CmMraRec",
    "ib_cm_dreq_t": "ibal.cm.records.CmDreq",
    "ib_cm_dreq_rec_t": "ibal.cm.records.CmDreqRec",
    "ib_cm_drep_t": "ibal.cm.records.CmDrep",
    "ib_cm_drep_rec_t": "ibal.cm.records.CmDrepRec",
    "ib_cm_lap_t": "ibal.cm.records.CmLap",
    "ib_cm_lap_rec_t": "ibal.cm.records.CmLapRec",
    "ib_cm_apr_t": "ibal.cm.records.CmApr",
    "ib_cm_apr_rec_t": "ibal.cm.records.CmAprRec",
    "ib_cm_failover_t": "ibal.cm.records.CmFailover",
    "ib_ari_t": "bytes, at most ibal.cm.records.ARI_SIZE (72)",
    "ib_apr_info_t": "bytes, at most ibal.cm.records.APR_INFO_SIZE (72)",
    **{f"ib_{m}_pdata_t": f"bytes, at most ibal.cm.records.{m.upper()}_PDATA_SIZE "
       f"({n}; ibal.cm.records.PDATA_MAX)"
       for m, n in (("req", 92), ("rep", 196), ("rtu", 224), ("rej", 148), ("mra", 222),
                    ("dreq", 220), ("drep", 224), ("lap", 168), ("apr", 148),
                    ("sidr_req", 216), ("sidr_rep", 136))},
}  # fmt: skip
# The CM's calls and callbacks (ibal.cm.api; the Pythonic shape is ibal.cm.connect/listen).
_CM_CALLS = {
    "ib_cm_listen": "ibal.cm.api.cm_listen(al, CmListen, listen_err_cb, context) -> "
    "ListenHandle; Pythonic: ibal.cm.listen(al, svc_id) -> Listener",
    "ib_cm_cancel": "listen_handle.cancel(destroy_cb) (ibal.cm.api.cm_cancel)",
    "ib_cm_req": "ibal.cm.api.cm_req(CmReq) -> CmConn (UD qp_type: SIDR_REQ); Pythonic: "
    "ibal.cm.connect(al, qp, path, svc_id) / ibal.cm.resolve_service(al, path, svc_id)",
    "ib_cm_rep": "ibal.cm.api.cm_rep(h_cm_req, CmRep); Pythonic: Incoming.accept(qp) / "
    "Incoming.answer(ud_qp)",
    "ib_cm_rtu": "ibal.cm.api.cm_rtu(h_cm_rep, CmRtu) (the Pythonic connect sends it itself)",
    "ib_cm_rej": "ibal.cm.api.cm_rej(h_cm, CmRej); Pythonic: Incoming.reject(reason, ari=)",
    "ib_cm_mra": "ibal.cm.api.cm_mra(h_cm, CmMra)",
    "ib_cm_handoff": "ibal.cm.api.cm_handoff(h_cm_req, svc_id) -> the new handle",
    "ib_cm_dreq": "ibal.cm.api.cm_dreq(CmDreq); Pythonic: Connection.disconnect()",
    "ib_cm_drep": "ibal.cm.api.cm_drep(h_cm_dreq, CmDrep) (the Pythonic shape answers itself)",
    "ib_cm_lap": "ibal.cm.api.cm_lap(CmLap)",
    "ib_cm_apr": "ibal.cm.api.cm_apr(h_cm_lap, CmApr)",
    "ib_force_apm": "ibal.cm.api.force_apm(qp)",
    "ib_pfn_cm_req_cb_t": "CmListen.req_cb(CmReqRec) (peer to peer: CmReq.req_cb), misc queue",
    "ib_pfn_cm_rep_cb_t": "CmReq.rep_cb(CmRepRec) (cm_status TIMEOUT: no REP), misc queue",
    "ib_pfn_cm_rtu_cb_t": "CmRep.rtu_cb(CmRtuRec), misc queue",
    "ib_pfn_cm_rej_cb_t": "CmReq/CmRep.rej_cb(CmRejRec), misc queue",
    "ib_pfn_cm_mra_cb_t": "CmReq/CmRep.mra_cb(CmMraRec), misc queue",
    "ib_pfn_cm_dreq_cb_t": "CmRep/CmRtu.dreq_cb(CmDreqRec), misc queue",
    "ib_pfn_cm_drep_cb_t": "CmDreq.drep_cb(CmDrepRec) (cm_status TIMEOUT: no DREP)",
    "ib_pfn_cm_lap_cb_t": "CmRep.lap_cb(CmLapRec): answer with cm_apr inside it",
    "ib_pfn_cm_apr_cb_t": "CmLap/CmRtu.apr_cb(CmAprRec) (cm_status TIMEOUT: no APR)",
    "ib_pfn_listen_err_cb_t": "cm_listen's listen_err_cb(ListenErrRec)",
}
_SA = {
    "ib_query", "ib_cancel_query", "ib_query_req_t", "ib_query_rec_t", "ib_query_type_t",
    "ib_user_query_t", "ib_pfn_query_cb_t", "ib_guid_pair_t", "ib_gid_pair_t", "ib_lid_pair_t",
    "ib_get_query_result", "ib_get_query_node_rec", "ib_get_query_path_rec",
    "ib_get_query_portinfo_rec", "ib_get_query_svc_rec", "ib_reg_svc", "ib_reg_svc_req_t",
    "_ib_reg_svc_rec_t", "ib_pfn_reg_svc_cb_t", "ib_dereg_svc", "ib_join_mcast",
    "ib_mcast_req_t", "ib_mcast_rec_t", "ib_pfn_mcast_cb_t", "ib_leave_mcast", "ib_subscribe",
    "ib_sub_req_t", "ib_sub_rec_t", "ib_pfn_sub_cb_t", "ib_report_rec_t", "ib_pfn_report_cb_t",
    "ib_unsubscribe", "DAPL Address Translation Service",
}
_DM = {
    "ib_create_ioc", "ib_destroy_ioc", "ib_reg_ioc", "ib_add_svc_entry", "ib_remove_svc_entry",
    "ib_reject_ioc", "ib_pnp_iou_rec_t", "ib_pnp_ioc_rec_t", "ib_pnp_ioc_path_rec_t",
}
_LATER_AL: dict[str, str] = {}  # access-layer entries not done yet (none left)

_ENTRIES = (
    "InfiniBand Access Layer", "DAPL Address Translation Service", "ib_add_svc_entry",
    "ib_al_flags_t", "ib_alloc_pd", "ib_apr_info_t", "ib_apr_pdata_t", "ib_ari_t",
    "ib_async_event_rec_t", "ib_bind_mw", "ib_cancel_mad", "ib_cancel_query", "ib_cep_listen_t",
    "ib_ci_call", "ib_close_al", "ib_close_ca", "ib_cm_apr", "ib_cm_apr_rec_t", "ib_cm_apr_t",
    "ib_cm_cancel", "ib_cm_drep", "ib_cm_drep_rec_t", "ib_cm_drep_t", "ib_cm_dreq",
    "ib_cm_dreq_rec_t", "ib_cm_dreq_t", "ib_cm_failover_t", "ib_cm_handoff", "ib_cm_lap",
    "ib_cm_lap_rec_t", "ib_cm_lap_t", "ib_cm_listen", "ib_cm_listen_t", "ib_cm_mra",
    "ib_cm_mra_rec_t", "ib_cm_mra_t", "ib_cm_rej", "ib_cm_rej_rec_t", "ib_cm_rej_t",
    "ib_cm_rep", "ib_cm_rep_rec_t", "ib_cm_rep_t", "ib_cm_req", "ib_cm_req_rec_t",
    "ib_cm_req_t", "ib_cm_rtu", "ib_cm_rtu_rec_t", "ib_cm_rtu_t", "ib_cq_create_t",
    "ib_create_av", "ib_create_cq", "ib_create_ioc", "ib_create_mad_pool", "ib_create_mw",
    "ib_create_qp", "ib_create_srq", "ib_dealloc_pd", "ib_dereg_mad_pool", "ib_dereg_mr",
    "ib_dereg_pnp", "ib_dereg_svc", "ib_destroy_av", "ib_destroy_cq", "ib_destroy_ioc",
    "ib_destroy_mad_pool", "ib_destroy_mw", "ib_destroy_qp", "ib_destroy_srq",
    "ib_device_attr_mask_t", "ib_dgrm_info_t", "ib_drep_pdata_t", "ib_dreq_pdata_t",
    "ib_force_apm", "ib_get_ca_by_gid", "ib_get_ca_guids", "ib_get_guid", "ib_get_mad",
    "ib_get_mad_buf", "ib_get_port_by_gid", "ib_get_query_node_rec", "ib_get_query_path_rec",
    "ib_get_query_portinfo_rec", "ib_get_query_result", "ib_get_query_svc_rec",
    "ib_get_spl_qp", "ib_gid_pair_t", "ib_guid_pair_t", "ib_init_dgrm_svc", "ib_join_mcast",
    "ib_lap_pdata_t", "ib_leave_mcast", "ib_lid_pair_t", "ib_listen_err_rec_t",
    "ib_listen_info_t", "ib_local_mad", "ib_mad_element_t", "ib_mad_svc_t",
    "ib_mad_svc_type_t", "ib_mcast_rec_t", "ib_mcast_req_t", "ib_modify_av", "ib_modify_ca",
    "ib_modify_cq", "ib_modify_qp", "ib_modify_srq", "ib_mra_pdata_t", "ib_open_al",
    "ib_open_ca", "ib_peek_cq", "ib_pfn_cm_apr_cb_t", "ib_pfn_cm_drep_cb_t",
    "ib_pfn_cm_dreq_cb_t", "ib_pfn_cm_lap_cb_t", "ib_pfn_cm_mra_cb_t", "ib_pfn_cm_rej_cb_t",
    "ib_pfn_cm_rep_cb_t", "ib_pfn_cm_req_cb_t", "ib_pfn_cm_rtu_cb_t", "ib_pfn_comp_cb_t",
    "ib_pfn_destroy_cb_t", "ib_pfn_event_cb_t", "ib_pfn_listen_err_cb_t",
    "ib_pfn_mad_comp_cb_t", "ib_pfn_mcast_cb_t", "ib_pfn_pnp_cb_t", "ib_pfn_query_cb_t",
    "ib_pfn_reg_svc_cb_t", "ib_pfn_report_cb_t", "ib_pfn_sub_cb_t", "ib_pnp_ca_rec_t",
    "ib_pnp_class_t", "ib_pnp_event_t", "ib_pnp_ioc_path_rec_t", "ib_pnp_ioc_rec_t",
    "ib_pnp_iou_rec_t", "ib_pnp_port_rec_t", "ib_pnp_rec_t", "ib_pnp_req_t", "ib_poll_cq",
    "ib_post_recv", "ib_post_send", "ib_post_srq_recv", "ib_put_mad", "ib_query",
    "ib_query_av", "ib_query_ca", "ib_query_ca_by_guid", "ib_query_cq", "ib_query_mr",
    "ib_query_mw", "ib_query_qp", "ib_query_rec_t", "ib_query_req_t", "ib_query_srq",
    "ib_query_type_t", "ib_rearm_cq", "ib_rearm_n_cq", "ib_reg_ioc", "ib_reg_mad_pool",
    "ib_reg_mad_svc", "ib_reg_mem", "ib_reg_phys", "ib_reg_pnp", "ib_reg_shared",
    "ib_reg_shmid", "ib_reg_svc", "_ib_reg_svc_rec_t", "ib_reg_svc_req_t", "ib_rej_pdata_t",
    "ib_reject_ioc", "ib_remove_svc_entry", "ib_rep_pdata_t", "ib_report_rec_t",
    "ib_req_pdata_t", "ib_rereg_mem", "ib_rereg_phys", "ib_rtu_pdata_t", "ib_send_mad",
    "ib_shmid_t", "ib_sidr_rep_pdata_t", "ib_sidr_req_pdata_t", "ib_sub_rec_t",
    "ib_sub_req_t", "ib_subscribe", "ib_sync_destroy", "ib_unsubscribe", "ib_user_query_t",
    "mlnx_create_fmr", "mlnx_destroy_fmr", "mlnx_map_fmr", "mlnx_unmap_fmr",
)


def _status(name: str) -> tuple[str, str]:
    if name in _DONE:
        return _DONE[name], "done"
    if name in _CM_RECORDS:
        return _CM_RECORDS[name], "done"
    if name in _CM_CALLS:
        return _CM_CALLS[name], "done"
    if name in _LATER_AL:
        return "", _LATER_AL[name]
    if name.startswith(("ib_cm_", "ib_pfn_cm_")) or name in _CM_TYPES:
        return "", "planned: ibal.cm"
    if name in _SA:
        return "", "planned: ibal.sa"
    if name in _DM:
        return "", "planned: ibal.dm"
    raise AssertionError(f"{name} has no mapping")  # pragma: no cover  (guarded by a test)


IBAL_MAPPING: list[tuple[str, str, str]] = [(n, *_status(n)) for n in _ENTRIES]
"""Every ``ib_al.h`` reference entry, in the reference's order.

Rows are ``(C name, ibal spelling, status)``; status is ``"done"``,
``"planned: <layer>"`` or ``"n/a: <why>"``.
"""


__all__ = [
    "IBAL_MAPPING",
    "ib_alloc_pd",
    "ib_bind_mw",
    "ib_cancel_mad",
    "ib_cancel_query",
    "ib_ci_call",
    "ib_close_al",
    "ib_close_ca",
    "ib_cm_apr",
    "ib_cm_cancel",
    "ib_cm_drep",
    "ib_cm_dreq",
    "ib_cm_handoff",
    "ib_cm_lap",
    "ib_cm_listen",
    "ib_cm_mra",
    "ib_cm_rej",
    "ib_cm_rep",
    "ib_cm_req",
    "ib_cm_rtu",
    "ib_create_av",
    "ib_create_cq",
    "ib_create_mad_pool",
    "ib_create_mw",
    "ib_create_qp",
    "ib_create_srq",
    "ib_dealloc_pd",
    "ib_dereg_mad_pool",
    "ib_dereg_mr",
    "ib_dereg_pnp",
    "ib_dereg_svc",
    "ib_destroy_av",
    "ib_destroy_cq",
    "ib_destroy_mad_pool",
    "ib_destroy_mw",
    "ib_destroy_qp",
    "ib_destroy_srq",
    "ib_force_apm",
    "ib_get_ca_by_gid",
    "ib_get_ca_guids",
    "ib_get_guid",
    "ib_get_mad",
    "ib_get_mad_buf",
    "ib_get_port_by_gid",
    "ib_get_query_node_rec",
    "ib_get_query_path_rec",
    "ib_get_query_portinfo_rec",
    "ib_get_query_result",
    "ib_get_query_svc_rec",
    "ib_get_spl_qp",
    "ib_init_dgrm_svc",
    "ib_join_mcast",
    "ib_leave_mcast",
    "ib_local_mad",
    "ib_modify_av",
    "ib_modify_ca",
    "ib_modify_cq",
    "ib_modify_qp",
    "ib_modify_srq",
    "ib_open_al",
    "ib_open_ca",
    "ib_peek_cq",
    "ib_poll_cq",
    "ib_post_recv",
    "ib_post_send",
    "ib_post_srq_recv",
    "ib_put_mad",
    "ib_query",
    "ib_query_av",
    "ib_query_ca",
    "ib_query_ca_by_guid",
    "ib_query_cq",
    "ib_query_mr",
    "ib_query_mw",
    "ib_query_qp",
    "ib_query_srq",
    "ib_rearm_cq",
    "ib_rearm_n_cq",
    "ib_reg_mad_pool",
    "ib_reg_mad_svc",
    "ib_reg_mem",
    "ib_reg_phys",
    "ib_reg_pnp",
    "ib_reg_shared",
    "ib_reg_shmid",
    "ib_reg_svc",
    "ib_reject_ioc",
    "ib_rereg_mem",
    "ib_rereg_phys",
    "ib_send_mad",
    "ib_subscribe",
    "ib_sync_destroy",
    "ib_unsubscribe",
    "mlnx_create_fmr",
    "mlnx_destroy_fmr",
    "mlnx_map_fmr",
    "mlnx_map_phys_fmr",
    "mlnx_unmap_fmr",
]
