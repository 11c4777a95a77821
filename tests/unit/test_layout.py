"""The package layout stays unambiguous: one module per basename, one class per name, no path hacks.

Two `report.py` files or two `class Config` make a traceback or a grep point at the wrong place, and
a `sys.path` edit in a bench or test hides an import that would fail for everyone else.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "p2p_trainer"
BENCH = ROOT / "bench"
SHARED_BASENAMES = {"__init__.py", "__main__.py"}


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def duplicate_basenames(files: Iterable[Path]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in files:
        if path.name not in SHARED_BASENAMES:
            seen[path.name].append(str(path))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def duplicate_classes(files: Iterable[Path]) -> dict[str, list[str]]:
    """Class names defined more than once, at any nesting level, with where each one is."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef):
                seen[node.name].append(f"{path}:{node.lineno}")
    return {name: places for name, places in seen.items() if len(places) > 1}


def _is_sys_path(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def sys_path_edits(files: Iterable[Path]) -> list[str]:
    """`sys.path.insert/append/extend(...)`, `sys.path += ...` and `sys.path = ...`, by location."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            call = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"insert", "append", "extend"}
                and _is_sys_path(node.func.value)
            )
            assign = (isinstance(node, ast.AugAssign) and _is_sys_path(node.target)) or (
                isinstance(node, ast.Assign) and any(_is_sys_path(t) for t in node.targets)
            )
            if call or assign:
                found.append(f"{path}:{getattr(node, 'lineno', 0)}")
    return sorted(found)


def package_and_bench_files() -> list[Path]:
    """The product and the benches together: a bench module is imported and grepped like the rest."""
    return python_files(PACKAGE) + python_files(BENCH)


def test_no_two_modules_share_a_basename() -> None:
    files = package_and_bench_files()
    assert len(python_files(PACKAGE)) > 50
    assert len(python_files(BENCH)) > 5
    assert duplicate_basenames(files) == {}


def test_no_two_classes_share_a_name() -> None:
    assert duplicate_classes(package_and_bench_files()) == {}


def test_no_sys_path_edits_in_benches_or_tests() -> None:
    files = python_files(BENCH) + python_files(ROOT / "tests")
    assert sys_path_edits(files) == []


def test_the_layout_checks_catch_violations(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "report.py", tmp_path / "b" / "report.py"
    first.write_text("class Record:\n    class Inner:\n        pass\n")
    second.write_text("import sys\n\nclass Inner:\n    pass\n\nsys.path.insert(0, '.')\nsys.path += ['x']\n")
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "b" / "__init__.py").write_text("")
    files = python_files(tmp_path)
    assert duplicate_basenames(files) == {"report.py": [str(first), str(second)]}
    assert duplicate_classes(files) == {"Inner": [f"{first}:2", f"{second}:3"]}
    assert sys_path_edits(files) == [f"{second}:6", f"{second}:7"]
