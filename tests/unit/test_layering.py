"""The package's layering, read from the import statements of every module (function-level imports included).

- nothing imports ``pgcli.cli`` (the entry point sits on top; ``pgcli/__main__.py`` is its only caller);
- ``pgcli/ops`` (pure math) imports nothing from pgcli outside ``pgcli.ops``;
- only ``pgcli/tracking/backend.py`` imports ``mlflow`` (MLflow is a backend behind one logger interface).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgcli

PACKAGE = Path(pgcli.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute dotted names (``from . import x`` resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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


def modules() -> dict[str, set[str]]:
    return {str(p.relative_to(PACKAGE.parent)): imported_modules(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_import_walker_sees_function_level_imports():
    # the walker itself: a nested import and a relative one must be found, or the rules below would pass vacuously
    assert "pgcli.config.compose" in imported_modules(PACKAGE / "cli.py")
    tracking = imported_modules(PACKAGE / "tracking" / "backend.py")
    assert "mlflow.tracking" in tracking and "mlflow.entities" in tracking  # both imported inside functions


def test_nothing_imports_the_cli():
    importers = [m for m, imports in modules().items() if any(i == "pgcli.cli" or i.startswith("pgcli.cli.")
                 for i in imports) and m != "pgcli/__main__.py"]  # fmt: skip
    assert not importers, f"these import pgcli.cli (config loading lives in pgcli.config.compose): {importers}"


def test_ops_import_nothing_above_them():
    offenders = {
        m: sorted(i for i in imports if i.split(".")[0] == "pgcli" and not i.startswith("pgcli.ops"))
        for m, imports in modules().items()
        if m.startswith("pgcli/ops/")
    }
    assert not {m: i for m, i in offenders.items() if i}, offenders


def test_only_the_tracking_module_imports_mlflow():
    importers = [m for m, imports in modules().items() if any(i.split(".")[0] == "mlflow" for i in imports)]
    assert importers == ["pgcli/tracking/backend.py"], importers
