"""The shape STYLE.md asks of the code, checked on every module: only the store talks to SQLAlchemy
and Alembic, and the store imports nothing of the floors above it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fleetd"
# What the store may import of fleetd: the error table, the process states and the learning-health
# records it stores (fleetd/health/rules.py and the settings those take); and the package itself,
# for where it lies (the migrations beside it).
STORE_MAY_IMPORT = {"fleetd.store", "fleetd.errors", "fleetd.states", "fleetd.health.rules", "fleetd.health.settings"}


def imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "fleetd":  # `from fleetd import jobs`
            names += [f"fleetd.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 100, found  # the package is where this test thinks it is
    return found


def test_only_the_store_imports_sqlalchemy_or_alembic() -> None:
    outside = {
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in modules() if PACKAGE / "store" not in path.parents
        for name in imports(path) if name.split(".")[0] in ("sqlalchemy", "alembic")
    }  # fmt: skip
    assert outside == set()


def test_the_store_imports_nothing_of_the_floors_above_it() -> None:
    above = {
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in (PACKAGE / "store").rglob("*.py")
        for name in imports(path)
        if name.startswith("fleetd.") and not any(name == m or name.startswith(m + ".") for m in STORE_MAY_IMPORT)
    }  # fmt: skip
    assert above == set()
