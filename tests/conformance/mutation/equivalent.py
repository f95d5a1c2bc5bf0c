"""Surviving mutants that cannot change behaviour, each with the reason.

Key: (file, original line, mutated line), both stripped, as ``run.py`` prints them.
"""

from __future__ import annotations

EQUIVALENT: dict[tuple[str, str, str], str] = {
    (
        "tests/sample_provider/ibal_sample_provider/memory.py",
        "self._next_key += 1",
        "self._next_key += 2",
    ): "keys need only be distinct, non-zero and 32-bit; any positive stride gives that "
    "for far more registrations than max_mrs allows at once",
    **{
        (
            "tests/sample_provider/ibal_sample_provider/memory.py",
            "if offset < 0 or length < 0 or offset + length > mr.length:",
            f"if offset < 0 or {zero} or offset + length > mr.length:",
        ): "refuses length 0, which only a zero-length SGE still brings here (a zero-length "
        "RDMA returns before translate, IBA C9-88); the contract does not define zero-length "
        "SGEs (mlx5 reads 0 as 2 GiB), so the suite neither requires nor forbids them"
        for zero in ("length <= 0", "length < 1")
    },
}
