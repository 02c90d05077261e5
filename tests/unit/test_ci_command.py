"""CI runs the README's test command, exactly as a user types it: the Quickstart's last command
is a line of .ci/run (whatever CI adds runs after it, from the test venv that command made)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the Quickstart has no bash block"
    return [
        line.strip()
        for line in block.group(1).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_ci_runs_the_readmes_test_command_unchanged() -> None:
    test_command = quickstart_commands()[-1]
    assert test_command == "scripts/test"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in [line.strip() for line in ci]
    # nothing of CI's own before it but its settings: the command runs as a user runs it
    before = ci[: [line.strip() for line in ci].index(test_command)]
    assert all(
        not line.strip() or line.startswith(("#", "set ", "cd ", "export ")) for line in before
    ), before
