"""The family matrix's numbers, collected while its tests run; with UPSLOPE_FAMILY_TABLE=PATH they are
written as the table between the markers in that Markdown file at the end of the session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

RESULTS: dict[str, dict[str, float]] = {}
START, END = "<!-- family matrix: start -->", "<!-- family matrix: end -->"


@pytest.fixture
def family_results():
    def record(family: str, check: str, value: float) -> None:
        RESULTS.setdefault(check, {})[family] = value
    return record


def table() -> str:
    from upslope.families import FAMILIES

    families = list(FAMILIES)
    lines = ["| check | " + " | ".join(families) + " |", "|---" * (len(families) + 1) + "|"]
    for check in sorted(RESULTS):
        cells = [("refused" if RESULTS[check][f] != RESULTS[check][f] else f"{RESULTS[check][f]:.1e}")
                 if f in RESULTS[check] else "-" for f in families]
        lines.append(f"| {check} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("UPSLOPE_FAMILY_TABLE")
    if not path or not RESULTS:
        return
    doc = Path(path)
    text = doc.read_text()
    if START in text and END in text:
        head, rest = text.split(START, 1)
        doc.write_text(head + START + "\n" + table() + "\n" + END + rest.split(END, 1)[1])
