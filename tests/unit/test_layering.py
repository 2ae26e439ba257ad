"""The package's layering, read from the import statements of every module (imports inside functions and under
``TYPE_CHECKING`` included, so a cycle cannot hide in a function body). docs/architecture.md states the rules:

- the packages stand on floors (:data:`FLOORS`, ground floor first) and no import runs from a lower floor to a higher
  one;
- no import cycle between pgcli's modules (an empty allowlist);
- nothing imports ``pgcli.cli`` (the entry point sits on top; ``pgcli/__main__.py`` is its only caller);
- ``pgcli/ops`` (pure math) imports nothing from pgcli outside ``pgcli.ops``;
- ``pgcli/algo`` (the trainers) imports nothing of the monitor's implementation, the run or tracking: trainers see the
  :class:`pgcli.contracts.Monitor` protocol only; every trainer (a class with a ``learn`` method) lives there, so the
  rule reaches them all;
- ``pgcli/config`` imports nothing that builds envs, tasks, trainers or runs (checks that need the world run after
  composition, in ``pgcli.training.checks``);
- only the ``pgcli/tracking`` package imports ``mlflow`` (MLflow is a backend behind one logger interface);
- no module over 500 lines of code, no function over 60 (a trainer's update step in ``pgcli/algo`` aside; lines of
  code: not blank, not a comment, not a docstring, so the formatter's layout costs nothing), and about a dozen
  modules at the top of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgcli

PACKAGE = Path(pgcli.__file__).resolve().parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
UPDATE_STEPS = ("_update", "_policy_step", "_critic_step")
"""A trainer's update step reads top to bottom like its paper (docs/STYLE.md), so it may run longer."""
MAX_TOP_LEVEL_MODULES = 12
FLOORS: tuple[tuple[str, ...], ...] = (
    ("pgcli.errors", "pgcli.redact", "pgcli.contracts"),  # what every layer may name: errors, masking, contracts
    ("pgcli.ops",),  # pure math
    ("pgcli.config",),  # what a run asks for
    ("pgcli.tracking",),  # MLflow behind one logger interface
    ("pgcli.hardware",),  # devices, cores, helper processes
    ("pgcli.envs",),  # environments
    ("pgcli.lm",),  # text tasks and causal LMs
    ("pgcli.algo",),  # the trainers
    ("pgcli.agent", "pgcli.video"),  # a saved agent loaded back; episode videos
    ("pgcli.training",),  # one training job
    ("pgcli.compare", "pgcli.sweeps", "pgcli.pyfunc"),  # many runs; the MLflow Model's loader
    ("pgcli.commands",),  # one module per command
    ("pgcli.cli", "pgcli.__main__"),  # the entry point
)
"""The floors of the house, ground floor first: a module imports from its own floor or the ones below, never above."""


def module_name(path: Path) -> str:
    """``pgcli/envs/make.py`` -> ``pgcli.envs.make``; a package's ``__init__.py`` is the package itself."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, module: str | None = None) -> set[str]:
    """Every module ``path`` (the module ``module``, by default its name in pgcli) imports, as absolute dotted names
    (``from . import x`` resolved)."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "conf" not in p.relative_to(PACKAGE).parts)


def modules() -> dict[str, set[str]]:
    return {str(p.relative_to(PACKAGE.parent)): imported_modules(p) for p in python_files()}


def import_graph() -> dict[str, set[str]]:
    """Module -> the pgcli modules it imports (``from pgcli.x import name`` counts as importing ``pgcli.x``)."""
    files = {module_name(p): imported_modules(p) for p in python_files()}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, imports in files.items():
        targets = {owner(i) for i in imports if i.split(".")[0] == "pgcli"}
        # a module importing its own package's __init__ (``from pgcli.config import X`` inside pgcli.config.*) is
        # counted; the package root ``pgcli`` (its version only) is not
        graph[module] = {t for t in targets if t is not None and t not in (module, "pgcli")}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` reaches through one or more imports."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module: the modules on a cycle, each with every module it both
    reaches and is reached from (a hundred modules: the quadratic way is fast enough and obviously right)."""
    reach = {module: reachable(graph, module) for module in graph}
    found: list[list[str]] = []
    for module in sorted(graph):
        if module in reach[module] and not any(module in component for component in found):
            found.append(sorted(other for other in reach[module] if module in reach.get(other, ())))
    return found


def test_the_import_walker_sees_every_kind_of_import(tmp_path: Path):
    # the walker itself: imports inside functions, under TYPE_CHECKING and relative ones must be found, or the rules
    # below would pass vacuously
    source = tmp_path / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pgcli.training.run import Run\n"
        "def f():\n    import mlflow.tracking\n    from . import sibling\n    from ..ops import cg\n"
    )
    found = imported_modules(source, "pgcli.algo.example")
    assert {"pgcli.training.run", "mlflow.tracking", "pgcli.algo.sibling", "pgcli.ops.cg"} <= found
    assert any(i.startswith("mlflow") for i in imported_modules(PACKAGE / "tracking" / "backend.py"))


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(map(str, found))


def _importers(prefix: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        m: bad
        for m, imports in import_graph().items()
        if m == prefix or m.startswith(prefix + ".")
        if (bad := sorted(i for i in imports if any(i == f or i.startswith(f + ".") for f in forbidden)))
    }


def floor_of(module: str) -> int | None:
    """The index in :data:`FLOORS` of the package ``module`` belongs to (None: on no floor)."""
    for index, floor in enumerate(FLOORS):
        if any(module == name or module.startswith(name + ".") for name in floor):
            return index
    return None


def test_every_module_stands_on_a_floor():
    homeless = sorted(m for m in import_graph() if m != "pgcli" and floor_of(m) is None)  # the root: its version
    assert not homeless, f"put these in a package of FLOORS (or add their package there): {homeless}"


def test_no_import_runs_up_a_floor():
    graph = import_graph()
    upward = sorted(
        f"{m} -> {i}" for m, imports in graph.items() for i in imports if (floor_of(i) or 0) > (floor_of(m) or 0)
    )
    assert not upward, "imports from a lower floor to a higher one (FLOORS):\n" + "\n".join(upward)


def test_the_floor_rule_sees_an_upward_import():
    assert floor_of("pgcli.lm.tasks") < floor_of("pgcli.training.logged")  # type: ignore[operator]
    assert floor_of("pgcli.contracts") == 0 and floor_of("pgcli.cli") == len(FLOORS) - 1
    assert floor_of("pgcli.lmx") is None  # a prefix of a name is not its package


def test_nothing_imports_the_cli():
    importers = [m for m, imports in import_graph().items() if "pgcli.cli" in imports and m != "pgcli.__main__"]
    assert not importers, f"these import pgcli.cli (config loading lives in pgcli.config.compose): {importers}"


def test_ops_import_nothing_above_them():
    offenders = {
        m: sorted(i for i in imports if not i.startswith("pgcli.ops"))
        for m, imports in import_graph().items()
        if m.startswith("pgcli.ops")
    }
    assert not {m: i for m, i in offenders.items() if i}, offenders


def test_trainers_see_the_monitor_protocol_only():
    offenders = _importers("pgcli.algo", ("pgcli.training", "pgcli.tracking", "pgcli.commands", "pgcli.sweeps"))
    assert not offenders, offenders


def test_every_trainer_lives_in_algo():
    # a trainer elsewhere (SFT and the reward model's were in pgcli/lm) would escape the rule above; the contract that
    # says what a trainer is (a Protocol, pgcli/contracts.py) is not one
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{node.name}"
        for path in python_files()
        if path.parent.name != "algo"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and not any(isinstance(base, ast.Name) and base.id == "Protocol" for base in node.bases)
        and any(isinstance(item, ast.FunctionDef) and item.name == "learn" for item in node.body)
    ]
    assert not outside, f"trainers outside pgcli/algo: {outside}"


def test_config_builds_nothing():
    forbidden = ("pgcli.envs", "pgcli.lm", "pgcli.algo", "pgcli.training", "pgcli.tracking", "pgcli.hardware")
    offenders = _importers("pgcli.config", forbidden)
    assert not offenders, offenders


def test_only_the_tracking_package_imports_mlflow():
    importers = [m for m, imports in modules().items() if any(i.split(".")[0] == "mlflow" for i in imports)]
    outside = [m for m in importers if not m.startswith("pgcli/tracking/")]
    assert importers and not outside, outside


def code_lines(source: str) -> set[int]:
    """The line numbers of ``source`` that hold code: not blank, not only a comment, not part of a docstring (any
    string statement: module, class, function and attribute docstrings)."""
    tree = ast.parse(source)
    docs = {
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for line in range(node.lineno, node.end_lineno + 1)  # type: ignore[operator]
    }
    return {
        number
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docs
    }


def test_code_lines_leave_out_blanks_comments_and_docstrings():
    source = '"""Module.\n\nMore."""\n\n# why\nX = 1\n"""X\'s doc."""\n\n\ndef f():\n    """Doc."""\n    return X\n'
    assert code_lines(source) == {6, 10, 12}


def test_modules_stay_small():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in python_files()
        if (n := len(code_lines(p.read_text()))) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines of code: {long}"


def test_the_top_of_the_package_is_a_short_list():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_functions_stay_short():
    long = {}
    for path in python_files():
        trainer = path.parent.name == "algo"
        source = path.read_text()
        code = code_lines(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = len(code & set(range(node.lineno, node.end_lineno + 1)))  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES and not (trainer and node.name in UPDATE_STEPS):
                    long[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code: {long}"
