"""The list of conformance checks, their chapters and the spec rules they check.

Each check's docstring starts with its rule reference, e.g.
``"ci-contract rule 68 / access-layer rule 27: shrink below queued → IB_OVERFLOW"``.
This module parses those references, and renders the chapter table and the
rule-to-check mapping of ``docs/conformance.md``::

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

    def rules(self, source: str) -> list[int]:
        """The numbered rules of ``source`` ("ci-contract" or "access-layer") it checks."""
        out: list[int] = []
        for src, nums in _NUMBERED.findall(self.reference):
            if src == source:
                out += [int(n) for n in re.split(r"\s*,\s*", nums)]
        return out


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
            out.append(Check(cls.chapter, name, reference, summary, _variants(fn)))
    return out


def problems(found: Iterable[Check]) -> list[str]:
    """Checks without a docstring naming the rule they check."""
    bad = []
    for c in found:
        if not c.summary or not any(src in c.reference for src in SOURCES):
            bad.append(f"{c.name}: docstring must start with 'SOURCE rule N: ...'")
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
    for source, total in (("ci-contract", 100), ("access-layer", 114)):
        by_rule: dict[int, list[str]] = {}
        for c in found:
            for n in c.rules(source):
                by_rule.setdefault(n, []).append(c.name)
        lines += [
            f"### {source} rules → checks",
            "",
            f"{len(by_rule)} of the {total} rules have a check.",
            "",
            "| rule | checks |",
            "|---|---|",
        ]
        for n in sorted(by_rule):
            lines.append(f"| {n} | " + ", ".join(f"`{t}`" for t in by_rule[n]) + " |")
        missing = [n for n in range(1, total + 1) if n not in by_rule]
        lines += ["", f"Without a check: {', '.join(map(str, missing)) or 'none'}.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


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
