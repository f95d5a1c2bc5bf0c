"""Generate the documentation pages that are derived from code tables.

``python -m ibal.docgen`` rewrites them (and the generated part of pages listed in
:data:`SECTIONS`, such as the conformance rule -> checks table); ``tests/test_docs.py``
fails when a page is stale, so the docs cannot drift from the tables they describe.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ibal import qp_fsm

DOCS = Path(__file__).resolve().parent.parent / "docs"


def qp_state_machine_md() -> str:
    """docs/qp-state-machine.md from :mod:`ibal.qp_fsm`."""
    lines = [
        "# The QP state machine",
        "",
        "Generated from `ibal/qp_fsm.py` by `python -m ibal.docgen`; do not edit.",
        "",
        "Every `qp.modify(QpMod(...))` is checked against this table before a provider",
        "sees it. An illegal transition raises `InvalidQpState`, a missing required",
        "attribute `InvalidParameter`, an attribute the transition does not take",
        "`InvalidSetting`; the QP keeps its state. Attribute names are `QpMod` fields",
        "(`resp_res` is IBA's max_dest_rd_atomic, `init_depth` its max_rd_atomic,",
        "`primary_av` the primary path).",
        "",
        "| transport | from | to | required | optional |",
        "|---|---|---|---|---|",
    ]
    for transport, a, b, req, opt in qp_fsm.table_rows():
        lines.append(f"| {transport} | {a} | {b} | {req or '-'} | {opt or '-'} |")
    lines += [
        "",
        "Posting: sends are accepted in RTS and SQD, receives in every state but RESET",
        "(a QP in ERROR flushes them with `WR_FLUSHED_ERR`).",
        "",
    ]
    return "\n".join(lines)


def mapping_md() -> str:
    """docs/mapping.md from ``ibal.compat.IBAL_MAPPING``."""
    from ibal.compat import IBAL_MAPPING

    done = sum(1 for row in IBAL_MAPPING if row[2] == "done")
    lines = [
        "# `ib_al.h` → ibal",
        "",
        "Generated from `ibal.compat.IBAL_MAPPING` by `python -m ibal.docgen`; do not edit.",
        "",
        f"Every entry of the IBAL access-layer reference ({len(IBAL_MAPPING)} entries; "
        f"{done} done). The C spelling also exists as a function in `ibal.compat`",
        "where it is done.",
        "",
        "| IBAL | ibal | status |",
        "|---|---|---|",
    ]
    for c_name, py_name, status in IBAL_MAPPING:
        lines.append(f"| `{c_name}` | {f'`{py_name}`' if py_name else '-'} | {status} |")
    lines += _mad_mapping_lines()
    return "\n".join(lines) + "\n"


def _mad_mapping_lines() -> list[str]:
    """The IBMF and libibmad tables of docs/mapping.md (``ibal.mad.mapping``)."""
    from ibal.mad.mapping import IBMF_MAPPING, LIBIBMAD_MAPPING

    lines: list[str] = []
    for title, var, seed, rows in (
        ("IBMF", "IBMF_MAPPING", "seed 001, the IBMF client interface", IBMF_MAPPING),
        ("libibmad", "LIBIBMAD_MAPPING", "seed 004, libibmad", LIBIBMAD_MAPPING),
    ):
        done = sum(1 for row in rows if row[2] == "done")
        lines += [
            "",
            f"## {title} → ibal",
            "",
            f"Generated from `ibal.mad.mapping.{var}`. Every call and type of {seed} "
            f"({len(rows)} entries; {done} done). A done spelling is a real object",
            "(`tests/mad/test_mapping.py` resolves each one).",
            "",
            f"| {title} | ibal | status |",
            "|---|---|---|",
        ]
        for c_name, target, status, note in rows:
            spelling = f"`{target}`" if target else "-"
            if note:
                spelling += f": {note}"
            lines.append(f"| `{c_name}` | {spelling} | {status} |")
    return lines


def rmpp_state_machine_md() -> str:
    """docs/rmpp-state-machine.md from ``ibal.transport.rmpp.TRANSITIONS``."""
    from ibal.transport.rmpp import TRANSITIONS

    lines = [
        "# The RMPP state machines",
        "",
        "Generated from `ibal.transport.rmpp.TRANSITIONS` by `python -m ibal.docgen`; do not edit.",
        "",
        "The sender and the receiver refuse any state change this table lacks",
        "(`RmppError`); see docs/mad.md, section RMPP, for what they do.",
    ]
    for role in ("sender", "receiver"):
        rows = [r for r in TRANSITIONS if r[0] == role]
        ids = {s: s.name.lower() for _, a, _, b in rows for s in (a, b)}
        lines += ["", f"## {role.capitalize()}", "", "```mermaid", "stateDiagram-v2"]
        first = rows[0][1]
        lines.append(f"    [*] --> {ids[first]}")
        for s, i in ids.items():
            lines.append(f"    {i} : {s.value}")
        for _, a, event, b in rows:
            lines.append(f"    {ids[a]} --> {ids[b]} : {event}")
        lines += ["```", "", "| from | event | to |", "|---|---|---|"]
        lines += [f"| {a.value} | {event} | {b.value} |" for _, a, event, b in rows]
    return "\n".join(lines) + "\n"


def cm_state_machine_md() -> str:
    """docs/cm-state-machine.md from ``ibal.cm.fsm`` and ``ibal.cm.sidr_fsm``."""
    from ibal.cm.fsm import LAP_TRANSITIONS, TRANSITIONS
    from ibal.cm.sidr_fsm import SIDR_TRANSITIONS

    lines = [
        "# The CM state machines",
        "",
        "Generated from `ibal.cm.fsm.TRANSITIONS`, `LAP_TRANSITIONS` and",
        "`ibal.cm.sidr_fsm.SIDR_TRANSITIONS` by `python -m ibal.docgen`; do not edit.",
        "",
        "One `Cep` per connection endpoint, sans-IO: `handle(event, now)` returns the",
        "actions (`Transmit`, `ArmTimer`/`CancelTimer`, `Deliver`, `ModifyQp`,",
        "`EnterTimewait`, `Release`, `Drop`) for the I/O layer to carry out in order.",
        "A trigger is the event (`send X`: an API call carrying the message bytes;",
        "`recv X`: a received message; `timeout`: the armed timer; `QP established`:",
        "data arrived before the RTU; `stale`: a newer REQ/REP names this remote QPN and",
        "CA GUID; `destroy`: the owner is gone, no more upcalls), then a guard after `/`.",
        "An API call with no row raises `InvalidState` naming the state; a received",
        "message with no row is dropped with a reason (`Drop`), never an exception.",
        "",
        "Rules behind the rows:",
        "",
        "* Retransmit: REQ, REP, DREQ and LAP are resent every `timeout_ms` (the I/O",
        "  layer passes 2 x ms(packet life) + ms(response timeout), ms(t) = 1 << max(t-8, 0),",
        "  `retransmit_ms`) up to `retries` (max_cm_retries) times. An MRA changes the",
        "  interval to ms(service timeout) + ms(ACK timeout); resending goes on.",
        "* Time-outs: REQ -> REJ(Timeout, ARI = local CA GUID) and a `rep` upcall with",
        "  TIMEOUT; REP -> REJ(Timeout) and an `rtu` upcall with TIMEOUT; DREQ -> `drep`",
        "  TIMEOUT and TIMEWAIT; LAP -> `apr` TIMEOUT, the connection stays.",
        "* Entering DREQ sent, DREQ rcvd, timewait or closed moves a bound QP (the active",
        "  side's from its REQ, the passive side's from its REP) to ERROR, once.",
        "  TIMEWAIT lasts ms(the REQ's primary local ACK timeout), then `Release`.",
        "* Peer-to-peer: both sides send REQ; the side with the greater (local CA GUID,",
        "  local QPN) stays active and ignores the peer's REQ, the smaller one drops its",
        "  own and answers as the passive side (the comparison of Linux cm.c's unused",
        "  `cm_is_active_peer`; the spec texts here do not state the rule).",
        "* Stale connection (as Linux cm.c): the I/O layer rejects the new REQ/REP with",
        "  REJ(StaleConn) (`build_rej`) and sends `stale` to the old endpoint, which",
        "  disconnects (DREQ) when established or rejects (REJ StaleConn) when half-open.",
        "",
        "## Connection",
        "",
    ]
    lines += _diagram([(a, t, b) for a, t, b, _ in TRANSITIONS], ["idle", "listen"])
    lines += ["", "| from | trigger | to | does |", "|---|---|---|---|"]
    lines += [f"| {a.value} | {t} | {b.value} | {d} |" for a, t, b, d in TRANSITIONS]
    lines += [
        "",
        "## Alternate path (inside established)",
        "",
        "In ESTABLISHED the LAP/APR/MRA triggers and the timer go to this sub-machine.",
        "Leaving ESTABLISHED resets it to idle.",
        "",
    ]
    lines += _diagram([(a, t, b) for a, t, b, _ in LAP_TRANSITIONS], ["idle"])
    lines += ["", "| from | trigger | to | does |", "|---|---|---|---|"]
    lines += [f"| {a.value} | {t} | {b.value} | {d} |" for a, t, b, d in LAP_TRANSITIONS]
    lines += ["", "## SIDR", ""]
    lines += _diagram([(a, t, b) for a, t, b, _ in SIDR_TRANSITIONS], ["idle", "listen"])
    lines += ["", "| from | trigger | to | does |", "|---|---|---|---|"]
    lines += [f"| {a.value} | {t} | {b.value} | {d} |" for a, t, b, d in SIDR_TRANSITIONS]
    return "\n".join(lines) + "\n"


def _diagram(rows: list[tuple[Any, str, Any]], starts: list[str]) -> list[str]:
    """A mermaid state diagram of ``(from, trigger, to)`` rows (enum members)."""
    ids = {s: s.name.lower() for a, _, b in rows for s in (a, b)}
    out = ["```mermaid", "stateDiagram-v2"]
    out += [f"    [*] --> {i}" for i in starts]
    out += [f"    {i} : {s.value}" for s, i in ids.items()]
    out += [f"    {ids[a]} --> {ids[b]} : {t}" for a, t, b in rows]
    out.append("```")
    return out


PAGES: dict[str, Callable[[], str]] = {
    "qp-state-machine.md": qp_state_machine_md,
    "rmpp-state-machine.md": rmpp_state_machine_md,
    "cm-state-machine.md": cm_state_machine_md,
    "mapping.md": mapping_md,
}


def _conformance_md(text: str) -> str:
    """docs/conformance.md with its generated part (checks, rule -> checks, gaps) redone."""
    from ibal.testing.catalogue import updated

    return updated(text)


SECTIONS: dict[str, Callable[[str], str]] = {
    "conformance.md": _conformance_md,
}
"""Pages with a generated part between markers: name -> the page's text made current."""


def main() -> int:
    for name, render in PAGES.items():
        (DOCS / name).write_text(render())
        print(f"wrote docs/{name}")
    for name, update in SECTIONS.items():
        path = DOCS / name
        path.write_text(update(path.read_text()))
        print(f"wrote docs/{name} (generated part)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
