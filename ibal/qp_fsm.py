"""The IBA QP state machine (IBA vol. 1 11.2.5, table "QP state transition attributes").

One table, keyed by transport class and ``(from, to)``, gives the attributes a
``modify_qp`` must carry and may carry.  The access layer checks every modify
against it before any provider sees it, so an illegal transition or a missing
attribute is rejected without changing state; providers may use it too.
"""

from __future__ import annotations

from ibal.records import record
from ibal.status import InvalidParameter, InvalidQpState, InvalidSetting
from ibal.types import QpMod, QpState, QpType

S = QpState


@record(frozen=True)
class Rule:
    required: frozenset[str]
    optional: frozenset[str]


def _r(required: str = "", optional: str = "") -> Rule:
    return Rule(frozenset(required.split()), frozenset(optional.split()))


_BARE = _r()


# Attribute names are QpMod fields.  "primary_av" carries the path (the IBA
# "primary address vector"); "resp_res" is max_dest_rd_atomic and "init_depth"
# max_rd_atomic.
_ALT = "alternate_av apm_state"
# IBAL's rtr and rts modify structures carry the work queue depths (opts
# SQ_DEPTH/RQ_DEPTH): a CA with ``Capabilities.resize_qp`` resizes there.
_WQ = "sq_depth rq_depth"
_RC: dict[tuple[QpState, QpState], Rule] = {
    (S.RESET, S.INIT): _r("pkey_index port_num access"),
    (S.INIT, S.INIT): _r("", "pkey_index port_num access"),
    (S.INIT, S.RTR): _r(
        "primary_av path_mtu dest_qp rq_psn resp_res rnr_nak_timeout",
        f"alternate_av access pkey_index {_WQ}",
    ),
    (S.RTR, S.RTS): _r(
        "sq_psn local_ack_timeout retry_cnt rnr_retry_cnt init_depth",
        f"current_state access rnr_nak_timeout {_ALT} {_WQ}",
    ),
    (S.RTS, S.RTS): _r("", f"current_state access rnr_nak_timeout {_ALT} {_WQ}"),
    (S.RTS, S.SQD): _r("", "sqd_event"),
    (S.SQD, S.SQD): _r(
        "",
        "primary_av path_mtu local_ack_timeout retry_cnt rnr_retry_cnt init_depth resp_res "
        f"access pkey_index port_num rnr_nak_timeout {_ALT}",
    ),
    (S.SQD, S.RTS): _r("", f"current_state access rnr_nak_timeout {_ALT} {_WQ}"),
}
_UC: dict[tuple[QpState, QpState], Rule] = {
    (S.RESET, S.INIT): _r("pkey_index port_num access"),
    (S.INIT, S.INIT): _r("", "pkey_index port_num access"),
    (S.INIT, S.RTR): _r(
        "primary_av path_mtu dest_qp rq_psn", f"alternate_av access pkey_index {_WQ}"
    ),
    (S.RTR, S.RTS): _r("sq_psn", f"current_state access {_ALT} {_WQ}"),
    (S.RTS, S.RTS): _r("", f"current_state access {_ALT} {_WQ}"),
    (S.RTS, S.SQD): _r("", "sqd_event"),
    (S.SQD, S.SQD): _r("", f"primary_av path_mtu access pkey_index port_num {_ALT}"),
    (S.SQD, S.RTS): _r("", f"current_state access {_ALT} {_WQ}"),
    (S.SQERR, S.RTS): _r("", "current_state access"),
}
_UD: dict[tuple[QpState, QpState], Rule] = {
    (S.RESET, S.INIT): _r("pkey_index port_num qkey"),
    (S.INIT, S.INIT): _r("", "pkey_index port_num qkey"),
    (S.INIT, S.RTR): _r("", f"pkey_index qkey {_WQ}"),
    (S.RTR, S.RTS): _r("sq_psn", f"current_state qkey {_WQ}"),
    (S.RTS, S.RTS): _r("", f"current_state qkey {_WQ}"),
    (S.RTS, S.SQD): _r("", "sqd_event"),
    (S.SQD, S.SQD): _r("", "pkey_index qkey"),
    (S.SQD, S.RTS): _r("", f"current_state qkey {_WQ}"),
    (S.SQERR, S.RTS): _r("", "current_state qkey"),
}
# Special QPs are bound to their port at creation: no port_num.
_SPECIAL: dict[tuple[QpState, QpState], Rule] = {
    key: Rule(rule.required - {"port_num"}, rule.optional - {"port_num"})
    for key, rule in _UD.items()
}

_TABLES: dict[QpType, dict[tuple[QpState, QpState], Rule]] = {
    QpType.RC: _RC,
    QpType.UC: _UC,
    QpType.UD: _UD,
    QpType.MAD: _UD,
    QpType.QP0: _SPECIAL,
    QpType.QP1: _SPECIAL,
    QpType.QP0_ALIAS: _SPECIAL,
    QpType.QP1_ALIAS: _SPECIAL,
    QpType.RAW_IPV6: _SPECIAL,
    QpType.RAW_ETHER: _SPECIAL,
}

_ANY_STATE = tuple(QpState)


def rule(qp_type: QpType, current: QpState, target: QpState) -> Rule | None:
    """The rule for ``current -> target``, or ``None`` if the transition is illegal."""
    if target is S.RESET or target is S.ERROR:
        return _BARE  # any state may go to RESET or ERROR, with no attributes
    return _TABLES.get(qp_type, _RC).get((current, target))


def legal_targets(qp_type: QpType, current: QpState) -> tuple[QpState, ...]:
    """Every state ``current`` may move to."""
    return tuple(t for t in _ANY_STATE if rule(qp_type, current, t) is not None)


def check_modify(qp_type: QpType, current: QpState, mod: QpMod) -> Rule:
    """Validate ``mod`` against the table; raise the matching status exception.

    * illegal transition, or ``current_state`` that is not the real state:
      ``INVALID_QP_STATE``;
    * a required attribute missing: ``INVALID_PARAMETER``;
    * an attribute this transition does not accept: ``INVALID_SETTING``.
    """
    r = rule(qp_type, current, mod.state)
    if r is None:
        raise InvalidQpState(f"{qp_type.name} QP cannot go {current.name} -> {mod.state.name}")
    if mod.current_state is not None and mod.current_state is not current:
        raise InvalidQpState(
            f"current_state {mod.current_state.name} given, QP is in {current.name}"
        )
    given = mod.given() - {"current_state"}
    missing = r.required - given
    if missing:
        need = ", ".join(sorted(missing))
        raise InvalidParameter(f"{current.name} -> {mod.state.name} on {qp_type.name} needs {need}")
    extra = given - r.required - r.optional
    if extra:
        raise InvalidSetting(
            f"{current.name} -> {mod.state.name} on {qp_type.name} does not take "
            f"{', '.join(sorted(extra))}"
        )
    return r


def can_post_send(state: QpState) -> bool:
    """IBA 10.8.3 / 11.4.1.1: sends are accepted in RTS and SQD (they queue in SQD) and in
    SQE and ERROR, where each completes with ``WR_FLUSHED_ERR``, signaled or not."""
    return state in (S.RTS, S.SQD, S.SQERR, S.ERROR)


def sends_execute(state: QpState) -> bool:
    """States whose send queue executes work (RTS) or holds it for later (SQD)."""
    return state in (S.RTS, S.SQD)


def can_post_recv(state: QpState) -> bool:
    """IBA 1.2: receives are accepted from INIT on, also in error (they flush)."""
    return state is not S.RESET


def flushes_sends(state: QpState) -> bool:
    """A send posted in this state completes at once with ``WR_FLUSHED_ERR``."""
    return state in (S.SQERR, S.ERROR)


def observed_state(qp_type: QpType, current: QpState, new: QpState) -> QpState:
    """The state after an error the provider reported (an async event, an error
    completion) moved a QP ``current`` towards ``new`` -- ``current`` if it cannot
    apply: RESET and ERROR stay until a modify (a late report of an error from
    before a reset must not resurrect it), SQE is entered only from RTS/SQD and
    only by unreliable QPs (an RC send error is an ERROR)."""
    if current is S.RESET or current is S.ERROR or new is current:
        return current
    if new is S.SQERR:
        if qp_type is QpType.RC:
            return S.ERROR
        return new if current in (S.RTS, S.SQD) else current
    return new


def table_rows() -> list[tuple[str, str, str, str, str]]:
    """``(transport, from, to, required, optional)`` rows, for the docs."""
    rows = []
    for name, table in (("RC", _RC), ("UC", _UC), ("UD", _UD), ("QP0/QP1", _SPECIAL)):
        for (a, b), r in table.items():
            rows.append(
                (name, a.name, b.name, " ".join(sorted(r.required)), " ".join(sorted(r.optional)))
            )
        rows.append((name, "any", "RESET / ERROR", "", ""))
    return rows
