"""IBMF (seed 001) and libibmad (seed 004) names and their ibal spellings.

Each row is ``(C name, ibal target, status, note)``.  ``target`` is a dotted
path to a real object (module attribute, class member or dataclass field);
``status`` is ``done``, ``planned: <module>`` or ``not applicable: <why>``.
``tests/mad/test_mapping.py`` resolves every ``done`` target and checks that
no ``planned`` one exists yet, so the table cannot drift from the code;
``python -m ibal.docgen`` renders it into docs/mapping.md.

The two APIs differ from ibal in one way throughout: they keep process-wide
state (one umad port, global timeout and retries, agent ids) where ibal has
objects (a :class:`~ibal.mad.service.MadService` per class on a port, the
time-out and retries on each :class:`~ibal.mad.pool.MadElement`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import types
from typing import Final

__all__ = ["IBMF_MAPPING", "LIBIBMAD_MAPPING", "Row", "resolve"]

Row = tuple[str, str, str, str]

DONE: Final = "done"
_NO_GLOBALS: Final = "not applicable: no process-wide RPC state; every ibal object is thread-safe"

_SVC = "ibal.mad.service"
_POOL = "ibal.mad.pool"
_ALT = "ibal.mad.altqp"

IBMF_MAPPING: Final[list[Row]] = [
    ("ibmf_register", f"{_SVC}.reg_mad_svc", DONE,
     "one MadSvc(class, version, ...) on the port's alias QP (pd.get_spl_qp); "
     "a second service for the same class/version/method is ResourceBusy"),
    ("ibmf_unregister", f"{_SVC}.MadService.deregister", DONE,
     "pending sends complete CANCELED first"),
    ("ibmf_setup_async_cb", "ibal.mad.svc.MadSvc.recv_cb", DONE,
     "given at registration with support_unsol=True and the methods served"),
    ("ibmf_tear_down_async_cb", f"{_SVC}.MadService.deregister", DONE,
     "the callback goes with its service"),
    ("ibmf_msg_transport (sequenced, blocking)", "ibal.mad.transact", DONE,
     "returns the response element; Timeout after the retries"),
    ("ibmf_msg_transport (sequenced, callback)", f"{_SVC}.MadService.send_taken", DONE, ""),
    ("ibmf_msg_transport (unsequenced)", f"{_SVC}.MadService.send", DONE,
     "an element with resp_expected=False"),
    ("ibmf_alloc_msg", f"{_POOL}.PoolKey.get_mad", DONE, "from a MadPool registered with a PD"),
    ("ibmf_free_msg", f"{_POOL}.put_mad", DONE, "received elements too"),
    ("ibmf_alloc_qp", f"{_ALT}.alloc_qp", DONE,
     "alloc_qp(service, pkey, qkey, AltQpFlags.MAD_NO_RMPP, recv_cb=, send_cb=): a UD QP "
     "the MAD layer owns; MAD_RMPP and RAW_ONLY are Unsupported (IBMF_NOT_SUPPORTED)"),
    ("ibmf_query_qp", f"{_ALT}.AltQp.query", DONE, "AltQpAttr(qp_num, pkey, qkey, port_num)"),
    ("ibmf_modify_qp", f"{_ALT}.AltQp.modify", DONE,
     "a new P_Key goes through RESET (ResourceBusy while sends are on the wire)"),
    ("ibmf_free_qp", f"{_ALT}.AltQp.free", DONE, "pending sends complete CANCELED"),
    ("ibmf_msg_transport (alternate QP)", f"{_ALT}.AltQp.send", DONE,
     "TID matching, time-out and retries as on QP1"),
    ("ibmf_handle_t", f"{_SVC}.MadService", DONE, ""),
    ("ibmf_qp_handle_t", "ibal.al.alias.AliasQp", DONE,
     "IBMF_QP_HANDLE_DEFAULT: the alias QP0/QP1; others are ibal.mad.altqp.AltQp"),
    ("ibmf_register_info_t", "ibal.mad.svc.MadSvc", DONE,
     "CI GUID and port are the alias QP's; the class is MadSvc.mgmt_class"),
    ("ibmf_client_type_t", "ibal.wire.mad.consts.MgmtClass", DONE,
     "services register by class, version and methods, not by agent/manager role"),
    ("ibmf_impl_caps_t", "", "not applicable: keys come from MadElement.addr on every send",
     ""),
    ("ibmf_retrans_t", f"{_POOL}.MadElement.timeout_ms", DONE,
     "and MadElement.retry_cnt, per request"),
    ("ibmf_msg_t", f"{_POOL}.MadElement", DONE, ""),
    ("ibmf_msg_bufs_t", f"{_POOL}.MadElement.mad", DONE,
     "one 256-byte buffer; ibal.wire.mad.header.payload views the class data"),
    ("ibmf_addr_info_t", "ibal.types.MadAddr", DONE, "MadElement.addr"),
    ("ibmf_global_addr_info_t", "ibal.types.MadAddr.grh", DONE, "an ibal.types.Grh or None"),
    ("ibmf_msg_cb_t", "ibal.mad.svc.MadCallback", DONE, "MadSvc.send_cb / MadSvc.recv_cb"),
    ("ibmf_async_event_cb_t", "ibal.al.pnp.PnpEvent.CA_REMOVE", DONE,
     "IBMF_CI_OFFLINE is the PnP CA-remove event (al.reg_pnp)"),
    ("IBMF_* return codes (34)", "ibal.status.IbError", DONE,
     "a failed call raises the matching ibal.status exception"),
]  # fmt: skip

LIBIBMAD_MAPPING: Final[list[Row]] = [
    # RPC
    ("madrpc_init", "ibal.mad.rpc.pick_port", DONE,
     "then MadClient(port): a MadService per class; errors raise, nothing aborts"),
    ("madrpc", "ibal.mad.transact", DONE,
     "on a MadService; tools: ibal.mad.rpc.MadClient.call (own time-out, window)"),
    ("madrpc_rmpp", "ibal.mad.rmpp_service.enable_rmpp", DONE,
     "then transact: the response arrives reassembled"),
    ("madrpc_portid", "", "not applicable: the umad port belongs to the rdma_core provider", ""),
    ("madrpc_set_retries", f"{_POOL}.MadElement.retry_cnt", DONE, "per request"),
    ("madrpc_set_timeout", f"{_POOL}.MadElement.timeout_ms", DONE, "per request, per attempt"),
    ("madrpc_save_mad", "", "not applicable: the caller keeps the request element's mad", ""),
    ("madrpc_lock", "", _NO_GLOBALS, ""),
    ("madrpc_unlock", "", _NO_GLOBALS, ""),
    ("madrpc_show_errors", "", "not applicable: errors raise; warnings go to logging", ""),
    ("ib_mad_dump_fn", "ibal.wire.mad.dump.format_value", DONE, "a field's style picks the format"),
    ("ibdebug", "", "not applicable: the logging module's levels", ""),
    # class registration
    ("mad_register_client", f"{_SVC}.reg_mad_svc", DONE, "MadSvc without methods"),
    ("mad_register_server", f"{_SVC}.reg_mad_svc", DONE,
     "MadSvc(methods=..., support_unsol=True)"),
    ("mad_class_agent", "", "not applicable: the MadService object is the agent", ""),
    ("mad_agent_class", "ibal.mad.svc.MadSvc.mgmt_class", DONE, "service.svc.mgmt_class"),
    # client functions
    ("ib_vendor_call", "ibal.mad.rpc.MadClient.call", DONE, "a Request of any class"),
    ("mad_is_vendor_range1", "ibal.wire.mad.consts.is_vendor_range1", DONE, ""),
    ("mad_is_vendor_range2", "ibal.wire.mad.consts.is_vendor_range2", DONE, ""),
    ("smp_query", "ibal.mad.rpc.MadClient.smp_get", DONE, "tools: ibal smpquery, ibal ibroute"),
    ("smp_set", "ibal.mad.rpc.MadClient.smp_set", DONE, ""),
    ("safe_smp_query", "", _NO_GLOBALS, ""),
    ("safe_smp_set", "", _NO_GLOBALS, ""),
    ("sa_call", "ibal.mad.rpc.MadClient.sa_get", DONE,
     "records split by ibal.wire.mad.sa.records"),
    ("ib_path_query", "ibal.mad.rpc.MadClient.sa_get", DONE, "PathRecord: ibal.wire.mad.sa"),
    ("safe_sa_call", "", _NO_GLOBALS, ""),
    ("port_performance_query", "ibal.mad.rpc.MadClient.perf_get", DONE, "tool: ibal perfquery"),
    ("port_performance_reset", "ibal.mad.rpc.MadClient.perf_set", DONE, "perfquery -r"),
    # server functions
    ("mad_send", f"{_SVC}.MadService.send", DONE, ""),
    ("mad_receive", "ibal.mad.svc.MadSvc.recv_cb", DONE, "a callback, not a blocking read"),
    ("mad_respond", "ibal.wire.mad.header.respond", DONE, "then service.send to element.addr"),
    ("mad_alloc", f"{_POOL}.PoolKey.get_mad", DONE, ""),
    ("mad_free", f"{_POOL}.put_mad", DONE, ""),
    # address resolution
    ("ib_resolve_smlid", "ibal.al.ca.Ca.query_port", DONE, "PortAttr.sm_lid"),
    ("ib_resolve_guid", "ibal.mad.rpc.MadClient.resolve_guid", DONE, "SA NodeRecord"),
    ("ib_resolve_portid_str", "ibal.mad.rpc.parse_portid", DONE, "LID or DR path; -G: above"),
    ("ib_resolve_self", "ibal.al.ca.Ca.query_port", DONE, "PortAttr.lid, .gids"),
    # port-id helpers
    ("portid2str", "ibal.wire.mad.dump.portid_str", DONE, ""),
    ("portid2portnum", "ibal.mad.rpc.PortId", DONE, "the last hop: PortId.dr_path[-1]"),
    ("str2drpath", "ibal.mad.rpc.parse_dr_path", DONE, ""),
    ("ib_portid_set", "ibal.types.MadAddr", DONE, "dlid, remote_qp, remote_qkey"),
    # field manipulation: one Table per attribute instead of global field ids
    ("mad_get_field", "ibal.wire.fields.Table.decode", DONE, "table.decode(buf, off)[name]"),
    ("mad_set_field", "ibal.wire.fields.Table.encode", DONE,
     "a table packs all its fields: decode, change, encode"),
    ("mad_get_field64", "ibal.wire.fields.Table.decode", DONE, "any width"),
    ("mad_set_field64", "ibal.wire.fields.Table.encode", DONE, "any width"),
    ("mad_get_array", "ibal.wire.fields.Table.decode", DONE, "Kind.BYTES fields are bytes"),
    ("mad_set_array", "ibal.wire.fields.Table.encode", DONE, ""),
    ("mad_decode_field", "ibal.wire.fields.Table.decode", DONE, ""),
    ("mad_encode_field", "ibal.wire.fields.Table.encode", DONE, "Table.check validates"),
    ("mad_encode", "ibal.wire.mad.header.build", DONE, "LID-routed or directed-route (dr_path=)"),
    ("mad_trid", f"{_SVC}.MadService.send", DONE, "a request with TID low half 0 gets one"),
    ("mad_build_pkt", "ibal.wire.mad.header.build", DONE,
     "address in MadElement.addr; RMPP header: ibal.wire.mad.rmpp.with_rmpp"),
    # dump
    ("mad_print_field", "ibal.wire.mad.dump.field_line", DONE, "infiniband-diags' dotted format"),
    ("mad_dump_field", "ibal.wire.mad.dump.field_line", DONE, ""),
    ("mad_dump_val", "ibal.wire.mad.dump.format_value", DONE, ""),
    # types
    ("ib_portid_t", "ibal.types.MadAddr", DONE, "tools: ibal.mad.rpc.PortId"),
    ("ib_dr_path_t", "ibal.wire.mad.header.DR_SMP", DONE, "build(..., dr_path=[ports])"),
    ("ib_rpc_t", "ibal.wire.mad.header.build", DONE, "its fields are build()'s arguments"),
    ("ib_sa_call_t", "ibal.wire.mad.header.SA_HEADER", DONE, "sm_key, attr_offset, comp_mask"),
    ("ib_vendor_call_t", "ibal.mad.rpc.Request", DONE, ""),
    ("ib_rmpp_hdr_t", "ibal.wire.mad.rmpp.RmppHeader", DONE, ""),
    ("ib_field_t", "ibal.wire.fields.Field", DONE, ""),
    ("ib_mad_f", "ibal.wire.mad.smp", DONE, "one Table per attribute: smp, sa, perf, cm, dm"),
    ("ib_attr_t", "ibal.wire.mad.consts.SmpAttr", DONE, "attribute IDs per class"),
]  # fmt: skip


def resolve(target: str) -> object:
    """The object ``target`` names, walked left to right as ``from a.b import c`` would.

    A name is looked up as an attribute first (so a package's exports win over
    a submodule of the same name), then
    as a submodule, then as a dataclass field.  Raises ``LookupError`` naming
    the part that does not exist.
    """
    first, *rest = target.split(".")
    obj: object = importlib.import_module(first)
    for name in rest:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        elif (module := _submodule(obj, name)) is not None:
            obj = module
        elif (field := _dataclass_field(obj, name)) is not None:
            obj = field
        else:
            raise LookupError(f"{target}: {name!r} not found")
    return obj


def _submodule(obj: object, name: str) -> types.ModuleType | None:
    """Package ``obj``'s submodule ``name``, imported; None when there is none."""
    if not isinstance(obj, types.ModuleType) or not hasattr(obj, "__path__"):
        return None
    full = f"{obj.__name__}.{name}"
    return importlib.import_module(full) if importlib.util.find_spec(full) else None


def _dataclass_field(obj: object, name: str) -> dataclasses.Field[object] | None:
    """A dataclass field without a class-level default (no attribute of the class)."""
    if not isinstance(obj, type) or not dataclasses.is_dataclass(obj):
        return None
    return next((f for f in dataclasses.fields(obj) if f.name == name), None)
