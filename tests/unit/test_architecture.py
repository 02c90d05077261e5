"""The floor plan, guarded: the report readers stay off the machine room, imports never go in a
circle, and only plugin.py knows pytest (ruff's banned-api rule says the same at lint time)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_specdecode"


def modules_loaded_by(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import pytest_specdecode.outputs.trend",
        "import pytest_specdecode.outputs.history",
        "import pytest_specdecode.outputs.trend_plot",
        "import pytest_specdecode.__main__",
    ],
)
def test_the_history_readers_load_no_server_pool_client_or_pytest(statement: str) -> None:
    loaded = modules_loaded_by(statement)
    forbidden = {
        name
        for name in loaded
        if name.startswith(
            ("pytest_specdecode.servers", "pytest_specdecode.session", "httpx", "_pytest")
        )
        or name in {"pytest", "pytest_specdecode.client"}
    }
    assert forbidden == set()


def test_the_measurement_core_needs_no_http_client() -> None:
    loaded = modules_loaded_by("import pytest_specdecode.verdict, pytest_specdecode.metrics")
    assert "httpx" not in loaded
    assert "pytest_specdecode.client" not in loaded


def package_imports() -> dict[str, set[str]]:
    """module → the package modules it imports (sim/ is self-contained and left out)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[1:2] == ["sim"]:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                known = [sub for sub in subs if sub in names]
                targets = known if len(known) == len(subs) else [node.module, *known]
            for target in targets:
                if target in names and target not in (name, "pytest_specdecode"):
                    graph[name].add(target)
    return graph


def test_imports_never_go_in_a_circle() -> None:
    graph = package_imports()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise AssertionError(f"import circle: {cycle}")
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_only_the_plugin_imports_pytest() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "plugin.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "pytest" or n.startswith(("pytest.", "_pytest")) for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
