"""Every `helm` command the documentation prints, exactly as printed, for the tests and `make lint` to run.

Where a command is: in a fenced code block, a line (continuations joined, a `$ ` prompt
dropped) that starts with `helm `; in running text, an inline code span that starts with
`helm ` and has more than subcommand words (`helm template` is a mention, `helm package
charts/praesto` a command). Each knows the `## ` section it is printed under. NOTES.txt is a template: its commands are taken from the NOTES
`helm install` prints (`notes_lines`), where they read as the user sees them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from testkit.helm_chart import CHART_DIR, ROOT

NOTES = CHART_DIR / "templates" / "NOTES.txt"
ELISIONS = ("...", "…", "<", ">")
VALUE_FLAGS = ("--set", "--set-string", "--set-json", "--set-file", "--set-literal", "-f", "--values")
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_MENTION = re.compile(r"helm(?: [a-z-]+)*")


@dataclass(frozen=True)
class HelmLine:
    document: Path
    line: int
    command: str
    section: str = ""  # the `## ` heading it is printed under ("" before the first)

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    def argv(self) -> list[str]:
        """The words bash would pass (comments dropped)."""
        return shlex.split(self.command, comments=True)


def documents() -> list[Path]:
    """The Markdown the user reads, in reading order: README, docs/, the chart README."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), CHART_DIR / "README.md"]


def helm_lines(document: Path) -> list[HelmLine]:
    """The helm commands `document` (Markdown) prints, in order."""
    found: list[HelmLine] = []
    prose: list[tuple[int, str]] = []
    lines = document.read_text().splitlines()
    fenced = False
    pending: tuple[int, str] | None = None
    headings: list[tuple[int, str]] = [(0, "")]
    for number, raw in enumerate(lines, 1):
        if _FENCE.match(raw):
            fenced = not fenced
            continue
        if not fenced:
            prose.append((number, raw))
            if raw.startswith("## "):
                headings.append((number, raw[3:].strip()))
            continue
        text = raw.strip()
        if pending is not None:
            start, head = pending
            text = head + "\n" + raw
            pending = None
        else:
            start = number
            text = text.removeprefix("$ ")
        if text.endswith("\\"):
            pending = (start, text)
        elif text.startswith("helm "):
            found.append(HelmLine(document, start, text))
    found.extend(_inline_commands(document, prose))
    return sorted(
        (replace(h, section=[title for start, title in headings if start < h.line][-1]) for h in found),
        key=lambda h: h.line,
    )


def _inline_commands(document: Path, prose: list[tuple[int, str]]) -> list[HelmLine]:
    """Inline code spans that are helm commands; a span may wrap onto the next line."""
    found: list[HelmLine] = []
    text = "\n".join(line for _, line in prose)
    starts = [number for number, _ in prose]
    for match in _INLINE.finditer(text):
        span = " ".join(match.group(1).split())
        if span.startswith("helm ") and not _MENTION.fullmatch(span):
            found.append(HelmLine(document, starts[text.count("\n", 0, match.start())], span))
    return found


def notes_lines(printed: str) -> list[HelmLine]:
    """The helm commands in the NOTES a `helm install` printed (after its "NOTES:" line)."""
    _, _, notes = printed.partition("\nNOTES:\n")
    return [
        HelmLine(NOTES, number, line.strip())
        for number, line in enumerate(notes.splitlines(), 1)
        if line.strip().startswith("helm ")
    ]


def elided(line: HelmLine) -> bool:
    """Whether the command leaves something for the reader to fill in (`...`, `<release>`)."""
    return any(mark in word for word in line.argv() for mark in ELISIONS)


def value_flags(line: HelmLine) -> list[str]:
    """The value-setting flags of a command (`--set k=v`, `-f file`), as argv words, in order."""
    words = line.argv()
    out: list[str] = []
    for index, word in enumerate(words):
        flag, eq, _ = word.partition("=")
        if flag in VALUE_FLAGS:
            out += [word] if eq else [word, words[index + 1]]
    return out
