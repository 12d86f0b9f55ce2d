"""Every reason the operator can report (condition reasons and Event reasons) has its row in
the troubleshooting page, and the README keeps its promises: the two commands first, the
install path on the first screen, under 12 KB, every command of its install block one the
getting-started pages run in the suite."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from docblocks import GETTING_STARTED, blocks

ROOT = Path(__file__).resolve().parents[2]
TROUBLESHOOT = (ROOT / "docs" / "how-to" / "troubleshoot.md").read_text()
README = ROOT / "README.md"


def _operator_sources() -> list[Path]:
    # found by walking the folder, not by module path: the operator's modules may move
    return sorted((ROOT / "operator").rglob("*.py"))


def _condition_reasons() -> set[str]:
    (module,) = [p for p in _operator_sources() if p.name == "conditions.py"]
    reasons = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            reasons.add(node.value.value)
    return reasons


def _event_reasons() -> set[str]:
    """The reason of every Event("Type", "Reason", ...) and every (type, reason, message)
    tuple a planner decision posts."""
    found = set()
    for path in _operator_sources():
        text = path.read_text()
        found |= set(re.findall(r'Event\(\s*"(?:Normal|Warning)",\s*"([A-Za-z]+)"', text))
        found |= set(re.findall(r'"(?:Normal|Warning)",\s*"([A-Z][A-Za-z]+)",', text))
        found |= set(re.findall(r'"(Planner[A-Z][A-Za-z]+)"', text))
    return found


def test_every_condition_reason_has_a_row():
    reasons = _condition_reasons()
    assert {"SpecInvalid", "ApplyRefused", "PodNotReady", "DeploymentStalled"} <= reasons
    missing = sorted(r for r in reasons if f"`{r}`" not in TROUBLESHOOT
                     and f"{r}`" not in TROUBLESHOOT)
    assert not missing, f"docs/how-to/troubleshoot.md does not list {missing}"


def test_every_event_reason_has_a_row():
    reasons = _event_reasons()
    assert {"PlannerHolding", "PlannerShortfall", "PlannerProfileInvalid", "DrainStarted"} <= reasons
    missing = sorted(r for r in reasons if r not in TROUBLESHOOT)
    assert not missing, f"docs/how-to/troubleshoot.md does not list {missing}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text()
    assert len(text.encode()) < 12_000
    first = text.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in first.splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]
    # the install path is on the first screen (about 50 lines)
    head = "\n".join(text.splitlines()[:50])
    assert "helm install pdscale charts/pdscale" in head and "Recommend" in head
    assert not re.search(r"\b[0-9a-f]{7}\b", text), "no commit hashes in the README"


def test_the_readmes_install_commands_are_the_getting_started_commands_the_suite_runs():
    text = README.read_text()
    install = text[text.index("## Install on a cluster"):]
    (readme_block,) = [b for b in blocks_of_text(install) if b]
    ran = {c for page in GETTING_STARTED for b in blocks(page) if b.run for c in b.commands}
    missing = [c for c in readme_block if c not in ran]
    assert not missing, f"README commands the getting-started tests do not run: {missing}"


def blocks_of_text(text: str) -> list[list[str]]:
    """The commands of the first ```bash block of ``text``."""
    m = re.search(r"```bash\n(.*?)```", text, re.S)
    if not m:
        return []
    joined = m.group(1).replace("\\\n", " ")
    return [[" ".join(c.split("#")[0].split()) for c in joined.splitlines() if c.strip()]]


def _operator_module(filename: str):
    """Import an operator module wherever it lives under operator/ (the folder may be split)."""
    import importlib

    (path,) = [p for p in _operator_sources() if p.name == filename]
    parts = path.relative_to(ROOT / "operator").with_suffix("").parts
    return importlib.import_module(".".join(("pdscale", "operator", *parts)))


def test_the_leader_election_messages_are_the_ones_the_operator_logs():
    leader = _operator_module("leader.py")
    said = [leader.off_reason({}), leader.off_reason({"PDSCALE_LEADER_ELECTION": "false"}),
            leader.missing_namespace_message("pdscale-system", "pdscale-operator-leader")]
    page = TROUBLESHOOT.replace("`", "")
    for message in said:
        assert message[:60] in page, f"the page does not quote {message[:60]!r}"


def test_every_link_of_the_readme_and_contributing_resolves():
    for doc in (README, ROOT / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).is_file(), f"{doc.name}: {target} does not exist"
