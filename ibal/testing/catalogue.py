"""The list of conformance checks, their chapters and the spec rules they prove.

Each check carries a :func:`ibal.testing.rules.rules` marker naming the rule ids
it proves (``@rules("ci:68", "al:27")``), and its docstring starts with the
human reference, e.g. ``"ci-contract rule 68 / access-layer rule 27: shrink
below queued → IB_OVERFLOW"``.  This module renders the chapter table and the
rule -> checks tables of ``docs/conformance.md`` from the markers, with every
rule no check proves listed as a gap with its reason
(:data:`ibal.testing.rules.GAPS`)::

    python -m ibal.testing.catalogue            # rewrite docs/conformance.md
    python -m ibal.testing.catalogue --check    # exit 1 if it is stale
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ibal.testing.rules import AL_ENFORCED, GAPS, IBA, NUMBERED, enumerated, known, marked

BEGIN = "<!-- BEGIN GENERATED: python -m ibal.testing.catalogue -->"
END = "<!-- END GENERATED -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"

_NUMBERED = re.compile(r"(ci-contract|access-layer) rules? ((?:\d+)(?:\s*,\s*\d+)*)")
SOURCES = (
    "ci-contract",
    "access-layer",
    "decisions",
    "api.md",
    "IBA",
    "ibal.qp_fsm",
    "design-anchors",
    "qp-state-machine",
)


@dataclass(frozen=True)
class Check:
    """One distinct check (a test method; its parametrisations count once)."""

    chapter: str
    name: str
    reference: str
    summary: str
    variants: int
    ids: tuple[str, ...] = ()
    direct: bool = False
    """It calls the provider's ChannelInterface itself (takes a raw-CI fixture)."""

    def rules(self, source: str) -> list[int]:
        """The numbered rules of ``source`` ("ci-contract" or "access-layer") it checks."""
        out: list[int] = []
        for src, nums in _NUMBERED.findall(self.reference):
            if src == source:
                out += [int(n) for n in re.split(r"\s*,\s*", nums)]
        return out


_DIRECT = {"raw_cis", "raw", "rawca", "provider_factory"}
"""Fixtures that hand a check the provider with no access layer in between."""


def _variants(fn: object) -> int:
    n = 1
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == "parametrize":
            n *= len(mark.args[1])
    return n


def checks() -> list[Check]:
    """Every check of the suite, chapter by chapter, in definition order."""
    from ibal.testing.suite import CHAPTERS

    out = []
    for cls in CHAPTERS:
        for name, fn in vars(cls).items():
            if not name.startswith("test_") or not callable(fn):
                continue
            doc = " ".join((inspect.getdoc(fn) or "").split())
            reference, _, summary = doc.partition(": ")
            direct = bool(_DIRECT & set(inspect.signature(fn).parameters))
            out.append(Check(cls.chapter, name, reference, summary, _variants(fn), marked(fn),
                             direct))  # fmt: skip
    return out


def proved_by(found: Iterable[Check]) -> dict[str, list[str]]:
    """Rule id -> the checks whose markers name it, in suite order."""
    out: dict[str, list[str]] = {}
    for c in found:
        for rule_id in c.ids:
            out.setdefault(rule_id, []).append(c.name)
    return out


def rule_problems(found: Iterable[Check]) -> list[str]:
    """Enumerated rules neither proved nor listed as a gap, and gaps a check now proves."""
    proved = proved_by(found)
    bad = [f"{r}: no check proves it and GAPS gives no reason" for r in enumerated()
           if r not in proved and r not in GAPS]  # fmt: skip
    bad += [f"{r}: listed in GAPS but proved by {proved[r]}" for r in GAPS if r in proved]
    bad += [f"{r}: GAPS names an unknown rule" for r in GAPS if r not in enumerated()]
    direct = {i for c in found if c.direct for i in c.ids}
    bad += [f"{r}: the access layer enforces it ({where}) and no direct CI check proves it"
            for r, where in AL_ENFORCED.items() if r not in direct]  # fmt: skip
    return bad


def problems(found: Iterable[Check]) -> list[str]:
    """Checks without a docstring naming their rule or without a valid rules marker."""
    bad = []
    for c in found:
        if not c.summary or not any(src in c.reference for src in SOURCES):
            bad.append(f"{c.name}: docstring must start with 'SOURCE rule N: ...'")
        if not c.ids:
            bad.append(f"{c.name}: no @rules(...) marker")
        bad += [f"{c.name}: unknown rule id {i!r}" for i in c.ids if not known(i)]
        numbered = {f"ci:{n}" for n in c.rules("ci-contract")}
        numbered |= {f"al:{n}" for n in c.rules("access-layer")}
        if not numbered <= set(c.ids):
            bad.append(f"{c.name}: docstring names {sorted(numbered - set(c.ids))}, "
                       "its marker does not")  # fmt: skip
    return bad


def render() -> str:
    """The generated part of docs/conformance.md."""
    found = checks()
    chapters: dict[str, list[Check]] = {}
    for c in found:
        chapters.setdefault(c.chapter, []).append(c)
    lines = [
        BEGIN,
        "",
        f"**{len(found)} distinct checks** ({sum(c.variants for c in found)} test items with "
        "parametrisation, before the loopback/two-CA split of the data-path chapter).",
        "",
        "| chapter | checks |",
        "|---|---|",
    ]
    lines += [f"| {name} | {len(cs)} |" for name, cs in chapters.items()]
    lines += ["", "### Checks by chapter", ""]
    for name, cs in chapters.items():
        lines += [f"#### {name}", "", "| check | rule | what it asserts |", "|---|---|---|"]
        for c in cs:
            summary = c.summary.replace("|", "\\|")
            lines.append(f"| `{c.name}` | {c.reference} | {summary} |")
        lines.append("")
    lines += _rule_tables(found)
    lines.append(END)
    return "\n".join(lines) + "\n"


def _rule_tables(found: list[Check]) -> list[str]:
    """The rule -> checks tables (from the markers) and the gaps with their reasons."""
    proved = proved_by(found)
    lines: list[str] = []

    def row(rule_id: str, label: str) -> str:
        names = proved.get(rule_id)
        if names:
            return f"| {label} | " + ", ".join(f"`{t}`" for t in names) + " |"
        return f"| {label} | **gap**: {GAPS.get(rule_id, 'no reason given').replace('|', '/')} |"

    for prefix, (title, total) in NUMBERED.items():
        ids = [f"{prefix}:{n}" for n in range(1, total + 1)]
        lines += [
            f"### {title} → checks (`{prefix}:N`)",
            "",
            f"{sum(1 for i in ids if i in proved)} of the {total} rules are proved by a check; "
            f"{sum(1 for i in ids if i not in proved)} are gaps.",
            "",
            "| rule | checks |",
            "|---|---|",
        ]
        lines += [row(i, i.split(":")[1]) for i in ids]
        lines.append("")
    ids = [f"iba:{name}" for name in IBA]
    lines += [
        "### IBA verbs compliance statements → checks (`iba:NAME`)",
        "",
        f"{sum(1 for i in ids if i in proved)} of the {len(ids)} statements are proved by a "
        "check; the IBA column is the Volume 1 section the checks cite (not re-read against "
        "the specification here).",
        "",
        "| statement | group | IBA | what it says | checks |",
        "|---|---|---|---|---|",
    ]
    for name, (group, section, text) in IBA.items():
        cells = row(f"iba:{name}", "").split(" | ", 1)[1]
        lines.append(f"| `{name}` | {group} | {section} | {text} | {cells}")
    direct: dict[str, list[str]] = {}
    for c in found:
        for i in c.ids:
            if c.direct:
                direct.setdefault(i, []).append(c.name)
    lines += [
        "",
        "### The provider on its own: rules the access layer also enforces",
        "",
        "A check through the access layer cannot see a provider break these (the access layer",
        "refuses first), so each has a check calling the provider's `ChannelInterface`",
        "directly (`ibal.testing.rules.AL_ENFORCED`).",
        "",
        "| rule | where the access layer enforces it | direct checks |",
        "|---|---|---|",
    ]
    for r, where in AL_ENFORCED.items():
        names = ", ".join(f"`{t}`" for t in direct.get(r, [])) or "**none**"
        lines.append(f"| {r} | {where} | {names} |")
    docs = sorted(r for r in proved if r.startswith("doc:"))
    lines += [
        "",
        "### Other references (`doc:`)",
        "",
        "Checks of behaviour that ibal's own documents state and no numbered rule does.",
        "",
        "| reference | checks |",
        "|---|---|",
    ]
    lines += [f"| {r[4:]} | {len(proved[r])} |" for r in docs]
    lines.append("")
    return lines


def updated(text: str) -> str:
    """``text`` with its generated section replaced by :func:`render`."""
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise ValueError(f"{BEGIN!r} not found")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"{END!r} not found")
    return head + render() + tail.lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(next((a for a in args if not a.startswith("-")), DOC))
    text = path.read_text()
    new = updated(text)
    if "--check" in args:
        if new != text:
            print(f"{path} is stale: run python -m ibal.testing.catalogue")
            return 1
        return 0
    path.write_text(new)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
