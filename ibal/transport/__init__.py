"""IBA transport rules shared by the providers' engines (mock and rxe).

Only small pure functions and tables live here: PSN arithmetic, the timer
formulas, NAK codes and what they complete with, P_Key/Q_Key matching, atomic
arithmetic.  Each engine keeps its own data path (see ``docs/decisions.md``).
"""
