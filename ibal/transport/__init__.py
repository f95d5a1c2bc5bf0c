"""The IBA transport rules: the RC/UC/UD/GSI sans-IO packet core and its shared rules.

:class:`~ibal.transport.core.QpCore` is one QP's requester, completer and
responder over :class:`~ibal.wire.packet.Packet` records; ``psn``, ``timers``,
``rules`` and ``wc`` hold the arithmetic, formulas and tables every engine uses;
:mod:`~ibal.transport.policy` names the questions on which the IBA text and
kernel rxe differ.  What the mock's message engine shares with it is in
``docs/decisions.md`` ("Transport engines").
"""
