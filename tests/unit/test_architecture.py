"""The floor plan, guarded: the report readers stay off the machine room, imports never go in a
circle, and only plugin.py knows pytest (ruff's banned-api rule says the same at lint time)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_specdecode.profiles.kinds.registry import KINDS

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


KINDS_FOLDER = PACKAGE / "profiles" / "kinds"
LAUNCHER_NAMES = frozenset(KINDS)
"""The registered kinds' names: a new kind's name is counted as soon as it is registered."""


def _is_kind_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in LAUNCHER_NAMES


def _is_kind_collection(node: ast.expr) -> bool:
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
        _is_kind_literal(element) for element in node.elts
    )


def _names_a_launcher(node: ast.expr) -> bool:
    """``profile.launcher``, ``launcher``, ``identity.get("kind")``, ``merged.get("launcher")``
    or a constant standing for launcher names (``LLAMACPP``, ``SIMULATED_LAUNCHERS``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "launcher"
    if isinstance(node, ast.Name):
        return node.id in ("launcher", "LLAMACPP", "LAUNCHERS", "SIMULATED_LAUNCHERS")
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in ("launcher", "kind")
    )


def launcher_comparisons(root: Path = PACKAGE) -> list[str]:
    """Every comparison against a launcher name outside the kinds' registry (sim/, the simulated
    server, is self-contained and has no launchers): a registered name as one side, a literal
    collection holding one, or a launcher (a profile's, a recorded identity's kind, a constant
    naming launchers) compared with anything."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "sim" or path.is_relative_to(KINDS_FOLDER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                continue  # `handle.launcher is not None`: the launcher object, not its name
            if any(
                _is_kind_literal(s) or _is_kind_collection(s) or _names_a_launcher(s) for s in sides
            ):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_outside_the_kinds_compares_launcher_names() -> None:
    """What differs between server kinds lives in profiles/kinds/ (one module a kind, one
    registration): nothing else asks which launcher a profile has by its name."""
    found = launcher_comparisons()
    print(f"launcher-name comparisons outside profiles/kinds/: {len(found)}")
    assert found == []
