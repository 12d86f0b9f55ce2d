"""The runnable blocks of the docs: a fenced ```bash block preceded by a marker comment

    <!-- docs-test: run expect="TEXT" expect="OTHER" -->

runs in the suite and must exit 0 and print every expected text. On the getting-started pages
every ```bash block must carry the marker (a command that cannot run here is fenced ```sh and
says why), so that what a reader copies is what the tests ran."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GETTING_STARTED = [ROOT / "docs" / "getting-started" / "install.md",
                   ROOT / "docs" / "getting-started" / "first-pdcluster.md"]

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*docs-test:\s*run(?P<args>[^>]*)-->\s*$")
_EXPECT = re.compile(r'expect="([^"]*)"')


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    script: str
    run: bool
    expect: tuple[str, ...]

    @property
    def commands(self) -> list[str]:
        """The block's commands, continuation lines joined, comments dropped."""
        joined = self.script.replace("\\\n", " ")
        return [" ".join(c.split("#")[0].split()) for c in joined.splitlines()
                if c.strip() and not c.strip().startswith("#")]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").splitlines()
        marker = _MARKER.search(before[-1]) if before else None
        found.append(Block(page=path.name, line=text[: m.start()].count("\n") + 1,
                           language=m.group(1), script=m.group(2), run=marker is not None,
                           expect=tuple(_EXPECT.findall(marker.group("args"))) if marker else ()))
    return found
