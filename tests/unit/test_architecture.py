"""The floor plan, guarded: the report readers stay off the machine room, imports never go in a
circle, only plugin.py knows pytest (ruff's banned-api rule says the same at lint time), and the
core and the simulator meet only in the neutral data module ``sglang_releases``."""

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


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: top level, inside if/try, but not under
    ``if TYPE_CHECKING:`` nor inside functions (those are type-only or deferred on purpose)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                test = node.test
                type_only = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                )
                if not type_only:
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for handler in node.handlers:
                    walk(handler.body)

    walk(tree.body)
    return found


def package_imports(module_level: bool = False) -> dict[str, set[str]]:
    """module → the package modules it imports (sim/ left out: its imports are checked below): every
    import anywhere in the module, or with ``module_level`` only those run at import time."""
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
        tree = ast.parse(path.read_text())
        nodes = (
            _module_level_imports(tree)
            if module_level
            else [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        )
        for node in nodes:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                known = [sub for sub in subs if sub in names]
                targets = known if len(known) == len(subs) else [node.module, *known]
            for target in targets:
                if target in names and target not in (name, "pytest_specdecode"):
                    graph[name].add(target)
    return graph


def room_of(module: str) -> str:
    """A top-level module is a room of its own; a wing (a folder, at any depth) is one room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else module


def longest_path(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """The longest downward path of an acyclic graph (the circle test runs beside this one)."""
    memo: dict[str, tuple[str, ...]] = {}

    def down(name: str) -> tuple[str, ...]:
        if name not in memo:
            memo[name] = (name,)  # guards a circle, which the circle test reports
            memo[name] = max(((name, *down(t)) for t in graph[name]), key=len, default=(name,))
        return memo[name]

    return max((down(name) for name in sorted(graph)), key=len)


# The floor plan's limits (issue 22): the next split lands in a wing, not in the corridor.
MAX_TOP_LEVEL_MODULES = 20
MAX_ROOMS = 28
MAX_FLOORS = 8
MAX_CHAIN = 10


def test_the_floor_plan_stays_within_its_limits() -> None:
    """Rooms (top-level modules but ``__init__``, and folders), floors (the longest downward
    path between rooms, any import) and the longest chain of modules imported at import time,
    printed (``-s``) so that a change can be measured, and held at the limits above."""
    top_level = sorted(p.name for p in PACKAGE.glob("*.py"))
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    rooms = len(top_level) - 1 + len(folders)
    graph = package_imports()
    rooms_graph: dict[str, set[str]] = {}
    for name, targets in graph.items():
        rooms_graph.setdefault(room_of(name), set())
        for target in targets:
            rooms_graph.setdefault(room_of(target), set())
            if room_of(target) != room_of(name):
                rooms_graph[room_of(name)].add(room_of(target))
    floors = longest_path(rooms_graph)
    chain = longest_path(package_imports(module_level=True))
    print(
        f"\ntop-level modules: {len(top_level)}; rooms: {rooms}; floors: {len(floors)} "
        f"({' → '.join(floors)}); longest import chain: {len(chain)} ({' → '.join(chain)})"
    )
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level
    assert rooms <= MAX_ROOMS, (top_level, folders)
    assert len(floors) <= MAX_FLOORS, floors
    assert len(chain) <= MAX_CHAIN, chain


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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every import in a package file, at any level (function bodies and ``TYPE_CHECKING`` blocks
    included), relative ones resolved: a module as its dotted name, a name taken from a module
    as ``MODULE:NAME``; ``importlib.import_module``/``__import__`` of a literal string too."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(
                    (node.lineno, sub if is_package_module(sub) else f"{base}:{alias.name}")
                )
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def in_sim(target: str) -> bool:
    return target == "pytest_specdecode.sim" or target.startswith(
        ("pytest_specdecode.sim.", "pytest_specdecode.sim:")
    )


def test_the_core_never_imports_the_simulator() -> None:
    """No module outside ``sim/`` imports it, not even in a function. The launchers that start
    it (``profiles/profile.py``'s ``SIM_MODULE``, run by ``servers/subprocess.py`` and the Docker
    launcher as ``python -m pytest_specdecode.sim``) name it in a string for another process,
    which is no import and needs no exception here."""
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line} imports {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "sim" not in path.relative_to(PACKAGE).parts[:1]
        for line, target in imports_of(path)
        if in_sim(target)
    ]
    assert offenders == []


#: All the simulator imports of the package outside ``sim/``, and why each. Exact: a new one
#: needs a line here (and a reason), one no longer used leaves the list.
SIM_MAY_IMPORT: dict[str, str] = {
    "pytest_specdecode:__version__": "the version its banner and /server_info's sim_version show",
    "pytest_specdecode.sglang_releases": (
        "what each SGLang release accepts and reports: the parser and /server_info fields of the "
        "release it speaks (the neutral data the core reads too)"
    ),
}


def test_the_simulator_imports_of_the_package_are_the_documented_ones() -> None:
    used: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "sim").rglob("*.py")):
        for line, target in imports_of(path):
            if target.startswith(("pytest_specdecode.", "pytest_specdecode:")) and not in_sim(
                target
            ):
                # a module's entry covers the names taken from it; the face's, name by name
                key = target if target.startswith("pytest_specdecode:") else target.split(":")[0]
                used.setdefault(key, []).append(f"{path.relative_to(PACKAGE)}:{line}")
    undocumented = {target: where for target, where in used.items() if target not in SIM_MAY_IMPORT}
    assert undocumented == {}
    assert sorted(used) == sorted(SIM_MAY_IMPORT), "an allowed import no longer used: drop it"


def test_the_neutral_data_module_imports_nothing_of_the_package() -> None:
    targets = [t for _, t in imports_of(PACKAGE / "sglang_releases.py")]
    assert [t for t in targets if t.startswith("pytest_specdecode")] == []


def test_a_simulator_process_loads_no_core_module() -> None:
    loaded = modules_loaded_by("import pytest_specdecode.sim.__main__")
    core = {name for name in loaded if name.startswith("pytest_specdecode") and not in_sim(name)}
    assert core == {"pytest_specdecode", "pytest_specdecode.sglang_releases"}


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


# A reader's screen (issue 48): no function of the package longer than this, and the plugin
# back to wiring only. The measuring path's driver is held shorter still: its steps are named
# functions a reader visits once each.
MAX_FUNCTION_LINES = 80
MAX_PLUGIN_LINES = 550
MAX_MEASURE_LINES = 40


def function_lengths(root: Path = PACKAGE) -> dict[str, int]:
    """``module.py:qualified.name`` -> lines from its ``def`` to its last line (docstring and
    comments inside included, decorators not), for every function and method of the package."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                lengths[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, rel, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, rel, f"{prefix}{child.name}.")

    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        visit(ast.parse(path.read_text()), rel, "")
    return lengths


def test_every_function_fits_on_a_screen() -> None:
    lengths = function_lengths()
    longest = sorted(lengths.items(), key=lambda item: -item[1])
    print("\nlongest functions: " + ", ".join(f"{name} {n}" for name, n in longest[:8]))
    assert [f"{name} {n}" for name, n in longest if n > MAX_FUNCTION_LINES] == []
    assert lengths["session/measurement.py:Measurer.measure"] <= MAX_MEASURE_LINES


def test_the_plugin_is_wiring_only() -> None:
    lines = len((PACKAGE / "plugin.py").read_text().splitlines())
    print(f"\nplugin.py: {lines} lines")
    assert lines <= MAX_PLUGIN_LINES
