"""The rules the conformance suite proves, and the marker that ties a check to them.

Three enumerated families, each of which every rule must be proved in (by a
check's :func:`rules` marker) or listed in :data:`GAPS` with the reason:

* ``ci:N``: rule N of ``ci-contract.md`` §4 (the provider contract, 100 rules);
* ``al:N``: rule N of ``access-layer.md`` §3 (the access-layer API, 114 rules);
* ``iba:NAME``: an IBA verbs compliance statement the contract relies on
  (:data:`IBA`: memory protection, atomics, RNR/retry, completions, multicast,
  CQ arming, QP state).

``doc:WHERE`` names a line of ibal's own documents (``doc:api.md``,
``doc:decisions``, ``doc:qp-state-machine``, a section of a spec study) for
checks of behaviour no numbered rule states; that family is not enumerated.

``docs/conformance.md`` carries the rule -> checks tables generated from the
markers (``python -m ibal.docgen``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

RULE_MARKER = "ibal_rules"
"""The pytest marker: ``ibal_rules("ci:68", "al:27")``."""

F = TypeVar("F", bound=Callable[..., Any])

NUMBERED: dict[str, tuple[str, int]] = {
    "ci": ("ci-contract.md §4", 100),
    "al": ("access-layer.md §3", 114),
}
"""Prefix -> (the spec study's rule list, how many rules it numbers)."""

IBA: dict[str, tuple[str, str, str]] = {
    # memory protection
    "mp.lkey": ("memory protection", "10.6.3", "an unknown L_Key completes LOCAL_PROTECTION_ERR"),
    "mp.local-bounds": ("memory protection", "10.6.3",
                        "an SGE reaching outside its region completes LOCAL_PROTECTION_ERR"),
    "mp.local-pd": ("memory protection", "10.2.3",
                    "an L_Key of another PD completes LOCAL_PROTECTION_ERR"),
    "mp.local-write": ("memory protection", "10.6.3",
                       "a receive or RDMA READ response into a region without LOCAL_WRITE "
                       "fails with a local protection error and writes nothing"),
    "mp.rkey": ("memory protection", "9.7.5.1.3",
                "an unknown R_Key completes REM_ACCESS_ERR, the target untouched"),
    "mp.remote-bounds": ("memory protection", "10.6.3",
                         "a remote access starting before the region's first byte or ending "
                         "after its last completes REM_ACCESS_ERR; one inside both ends works"),
    "mp.remote-rights": ("memory protection", "10.6.3",
                         "RDMA WRITE, READ and atomics need the region's matching remote right"),
    "mp.remote-pd": ("memory protection", "10.2.3",
                     "an R_Key of a region in another PD than the responder QP's is refused"),
    "mp.dead-keys": ("memory protection", "10.6.2",
                     "after deregister, rebind, invalidate or reregistration the old R_Key "
                     "reaches nothing, from a remote peer as well as locally"),
    "mp.zero-length": ("memory protection", "9.7.4.1 (C9-88)",
                       "a zero-length RDMA WRITE or READ needs no valid R_Key or address: it "
                       "completes successfully and touches no memory"),
    "mp.untouched": ("memory protection", "10.6.3",
                     "a refused remote access changes no byte of the responder's memory"),
    "mp.window-bounds": ("memory protection", "10.6.7",
                         "a bound window exposes exactly its range: first and last byte in, "
                         "one byte either side out"),
    "mp.window-rights": ("memory protection", "10.6.7",
                         "a bound window grants only the rights it was bound with"),
    "mp.window-pd": ("memory protection", "10.6.7",
                     "a bind through a QP of another PD is refused"),
    "mp.unbound-window": ("memory protection", "10.6.7.2",
                          "a window that is not bound (new, zero-length bind, invalidated) "
                          "refuses every access"),
    # atomics
    "at.fetch-add": ("atomics", "9.4.5",
                     "FETCH_ADD returns the original 64-bit value and adds modulo 2^64"),
    "at.cmp-swap": ("atomics", "9.4.5",
                    "CMP_SWAP returns the original value and swaps only when it equals compare"),
    "at.alignment": ("atomics", "9.4.5",
                     "an atomic to an address that is not 8-byte aligned is refused"),
    "at.bounds": ("atomics", "10.6.3",
                  "an atomic on the region's last 8 bytes works; one reaching past them is "
                  "refused and changes nothing"),
    "at.rights": ("atomics", "10.6.3", "an atomic needs the region's REMOTE_ATOMIC right"),
    # RNR and retry
    "rnr.exceeded": ("RNR and retry", "9.7.5.2.8",
                     "an RC SEND finding no receive, rnr_retry 0, completes RNR_RETRY_ERR"),
    "rnr.infinite": ("RNR and retry", "9.7.5.2.8",
                     "rnr_retry 7 retries until a receive is posted, then completes"),
    "retry.exceeded": ("RNR and retry", "9.7.6.1.3",
                       "no ACK within the timeout and retry_cnt 0 completes TIMEOUT_RETRY_ERR"),
    "retry.error-state": ("RNR and retry", "10.8.3",
                          "a failed RC request moves the requester QP to ERROR"),
    # completions
    "wc.order": ("completions", "10.8.3",
                 "a QP's completions arrive in the order its WRs were posted"),
    "wc.flush": ("completions", "10.8.3",
                 "after an error the WRs behind it complete WR_FLUSHED_ERR, in order"),
    "wc.signaling": ("completions", "10.8.3",
                     "an unsignaled successful send makes no completion; a signaled one does"),
    "wc.errors-complete": ("completions", "10.8.3",
                           "a failed or flushed WR completes even when unsignaled"),
    "wc.fields": ("completions", "11.4.2.1",
                  "a completion carries its wr_id (64 bits), opcode, status, QP number and, "
                  "for a receive, the byte count and immediate data"),
    "wc.length": ("completions", "9.9.3",
                  "a message larger than its receive completes with a length error"),
    "wc.isolation": ("completions", "10.8.3",
                     "an error on one QP does not affect another QP's completions"),
    # multicast
    "mc.fanout": ("multicast", "10.5",
                  "a datagram to a group reaches every QP attached to it"),
    "mc.detach": ("multicast", "10.5", "a detached QP receives nothing more from the group"),
    "mc.qkey": ("multicast", "10.2.4",
                "a group datagram whose Q_Key differs from the QP's is dropped"),
    # CQ arming
    "cq.arm-once": ("CQ arming", "11.4.2.2",
                    "an armed CQ calls back once for its next completion, then needs re-arming"),
    "cq.no-arm": ("CQ arming", "11.4.2.2", "a CQ that is not armed makes no callback"),
    "cq.arm-present": ("CQ arming", "11.4.2.2",
                       "completions already queued at arm time do not fire the callback"),
    "cq.solicited": ("CQ arming", "11.4.2.2",
                     "a solicited-only arm ignores completions without the solicited event"),
    "cq.per-cq": ("CQ arming", "11.4.2.2",
                  "arming one CQ never calls back for another CQ's completions"),
    # QP state
    "qps.reset": ("QP state", "10.3.1",
                  "a QP moved to RESET forgets its posted work; a new QP starts in RESET"),
    "qps.error-flush": ("QP state", "10.3.1",
                        "a QP in ERROR flushes its posted and newly posted work"),
    "qps.rtr": ("QP state", "10.3.1",
                "a QP in RTR receives (the responder works) but refuses sends"),
    "qps.sqd": ("QP state", "10.3.1",
                "SQD stops new sends until the QP returns to RTS, then they run"),
    "qps.sqe": ("QP state", "10.3.1",
                "a send error on UC/UD enters SQE, receives go on, SQE → RTS recovers"),
    "qps.transitions": ("QP state", "10.3.1",
                        "only the transitions of the state table are accepted"),
}
"""IBA verbs compliance statements the contract relies on: name -> (group, IBA section,
the statement as the suite checks it)."""

GAPS: dict[str, str] = {
    "ci:9": "a C artefact: ibal has no user-mode library, so no vend_id/libname slots "
            "(docs/decisions.md)",
    "ci:12": "ChannelInterface.open_ca takes no GUID (the object is the CA); an unknown GUID "
             "is the access layer's InvalidGuid (al:7)",
    "ci:14": "as ci:12: there is no GUID argument to get wrong",
    "ci:19": "no consumer code runs on a provider's stack in ibal; the callback rules are "
             "proved where they matter, at the access layer (al:3, al:4, al:114)",
    "ci:20": "as ci:19",
    "ci:21": "as ci:19",
    "ci:22": "a C size probe (p_ca_attr NULL): query_ca returns an object",
    "ci:23": "a C size probe: no caller-sized buffer in Python",
    "ci:30": "user-mode verbs (umv_buf) do not exist in ibal",
    "ci:31": "as ci:30",
    "ci:34": "exhausting a real HCA's PD limit is impractical and the mock's limit is a "
             "number the suite cannot learn without query_ca reporting it",
    "ci:41": "NULL out-pointers: query_av returns a value",
    "ci:54": "no user-mode path exists for create_spl_qp to refuse",
    "al:11": "a C size probe (ib_query_ca with NULL attributes)",
    "al:24": "user-mode AVs (umv_buf) do not exist in ibal",
    "al:33": "CQ wait objects (h_wait_obj) are a C/Windows artefact; ibal has callbacks",
    "al:43": "alias QPs (ib_get_spl_qp alias) belong to the MAD layer, not a provider",
    "al:113": "ib_ioc_* belongs to ibal.dm, tested in tests/dm against its real peers",
}
"""Enumerated rules with no check, and why."""

_LATER = "a layer above the provider, tested on its own (not a provider rule)"
for _first, _last, _what in (
    (69, 73, "MAD pools (ibal.mad, tests/mad)"),
    (77, 77, "MAD send ownership (ibal.mad, tests/mad)"),
    (80, 82, "RMPP, MAD AVs and cancel (ibal.mad, tests/mad)"),
    (84, 105, "CM and SIDR (ibal.cm, tests/cm against the lab's rdma_cm)"),
    (106, 111, "SA queries and services (ibal.sa, tests/sa against OpenSM on ibsim)"),
):
    for _n in range(_first, _last + 1):
        GAPS[f"al:{_n}"] = f"{_what}: {_LATER}"
del _first, _last, _what, _n

AL_ENFORCED: dict[str, str] = {
    "ci:26": "ibal.al.ca: modify_ca's port",
    "ci:27": "ibal.al.ca: modify_ca's unknown bits",
    "ci:39": "ibal.al.av: an AV's port",
    "ci:46": "ibal.al.qp: queue depths against query_ca",
    "ci:47": "ibal.al.qp: SGE counts against query_ca",
    "ci:48": "ibal.al.pd: the QP type against Capabilities.qp_types",
    "ci:52": "ibal.al.pd: get_spl_qp's port",
    "ci:55": "ibal.qp_fsm: every modify_qp transition",
    "ci:56": "ibal.al.qp: the P_Key index against the port's table",
    "ci:58": "ibal.al.mr / ibal.al.qp: atomic rights against Capabilities.atomics",
    "ci:66": "ibal.al.cq: a CQ's size against max_cqes",
    "ci:75": "ibal.al.mr: remote write and atomic need local write",
    "ci:81": "ibal.al.mr: the re-registration mask",
    "ci:87": "ibal.al.mr: bind_mw's QP type",
    "ci:90": "ibal.al.qp: post_send's QP state",
    "ci:92": "ibal.al.qp_work: invalidate opcodes against Capabilities.opcodes",
    "ci:93": "ibal.al.qp: post_recv in RESET",
    "ci:98": "ibal.al.cq: rearm_n's count",
    "ci:99": "ibal.al.qp: attach_mcast's QP type, GID and LID",
}
"""Provider rules the access layer also enforces (so a check through it cannot see the
provider break them): rule id -> where.  Each needs a check calling the provider's
``ChannelInterface`` directly."""

_ID = re.compile(r"^(ci|al):(\d+)$|^iba:([a-z0-9.-]+)$|^doc:.+$")


def known(rule_id: str) -> bool:
    """Whether ``rule_id`` names an enumerated rule or is a ``doc:`` reference."""
    m = _ID.match(rule_id)
    if m is None:
        return False
    if m.group(1):
        return 1 <= int(m.group(2)) <= NUMBERED[m.group(1)][1]
    if m.group(3):
        return m.group(3) in IBA
    return True


def enumerated() -> list[str]:
    """Every rule id that must be proved or listed as a gap, in table order."""
    out = [f"{p}:{n}" for p, (_, total) in NUMBERED.items() for n in range(1, total + 1)]
    return out + [f"iba:{name}" for name in IBA]


def rules(*ids: str) -> Callable[[F], F]:
    """Mark a check with the rules it proves (``@rules("ci:68", "iba:mp.rkey")``)."""
    bad = [i for i in ids if not known(i)]
    if not ids or bad:
        raise ValueError(f"unknown rule ids {bad}" if bad else "a check proves some rule")

    def mark(fn: F) -> F:
        return pytest.mark.ibal_rules(*ids)(fn)  # type: ignore[no-any-return]

    return mark


def marked(fn: object) -> tuple[str, ...]:
    """The rule ids of ``fn``'s :func:`rules` markers."""
    out: list[str] = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == RULE_MARKER:
            out += list(mark.args)
    return tuple(out)
