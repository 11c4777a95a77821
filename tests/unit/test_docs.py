"""Citations of docs/algorithms.md resolve, and docs/architecture.md covers every subpackage.

The code cites sections of the algorithms document as `§N`, `§N.M` or by title (`§ Notation`); a citation
that points at no heading sends a reader nowhere, and a renumbered section silently breaks them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = ROOT / "docs/algorithms.md"
ARCHITECTURE = ROOT / "docs/architecture.md"
SCANNED = ("p2p_trainer", "bench", "tests", "peers", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".cfg", ".yaml", ".yml"}

NUMBERED = re.compile(r"§\s*(\d+(?:\.\d+)?)")
NAMED = re.compile(r"§ ([A-Z][a-z]+)")
HEADING = re.compile(r"^#{1,6}\s+§(\d+(?:\.\d+)?)\s+(.+?)\s*$", re.MULTILINE)
DOC_PATH = re.compile(r"[\w./-]*algorithms\.md", re.IGNORECASE)


def text_files(roots: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        files += [
            p
            for p in candidates
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        ]
    return files


def headings(markdown: str) -> dict[str, str]:
    """Section number -> title, for every `#… §N Title` heading."""
    return {number: title for number, title in HEADING.findall(markdown)}


def unresolved_citations(files: Iterable[Path], sections: dict[str, str]) -> list[str]:
    """`path:line: §X` for every citation that matches no heading (by number, or by title)."""
    titles = {title.split()[0] for title in sections.values()}
    bad = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            missing = [f"§{n}" for n in NUMBERED.findall(line) if n not in sections]
            missing += [f"§ {t}" for t in NAMED.findall(line) if t not in titles]
            bad += [f"{path}:{lineno}: {m}" for m in missing]
    return bad


def broken_doc_paths(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """References to the algorithms document whose path exists neither from the repository root nor
    from the citing file's folder (this also catches the upper-case name of the old document, which
    lived outside the repository)."""
    bad = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for ref in DOC_PATH.findall(line):
                if not ((root / ref).is_file() or (path.parent / ref).is_file()):
                    bad.append(f"{path}:{lineno}: {ref}")
    return bad


def subpackages(package: Path) -> list[str]:
    """Folders below `package` holding Python modules, as paths relative to it ("lab/chaos")."""
    dirs = {p.parent for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(d.relative_to(package).as_posix() for d in dirs if d != package)


def unnamed_folders(doc: str, folders: Iterable[str]) -> list[str]:
    return [f for f in folders if not re.search(rf"(?<![\w/]){re.escape(f)}/", doc)]


def test_algorithms_doc_has_numbered_sections() -> None:
    sections = headings(ALGORITHMS.read_text(encoding="utf-8"))
    assert {"0", "1", "2", "3", "4", "5", "6", "7", "8"} <= set(sections)
    assert sections["4"].startswith("Quorum")


def test_every_section_citation_resolves() -> None:
    sections = headings(ALGORITHMS.read_text(encoding="utf-8"))
    files = text_files(ROOT / name for name in SCANNED)
    assert len(files) > 50
    assert unresolved_citations(files, sections) == []


def test_every_algorithms_reference_points_at_the_doc() -> None:
    files = text_files(ROOT / name for name in SCANNED)
    assert broken_doc_paths(files) == []


def test_the_checks_catch_a_bad_citation(tmp_path: Path) -> None:
    # assembled from pieces, so that this file's own text holds no unresolved citation
    old_name, section, unnamed = "ALGORITHMS" + ".md", "§" + "12.3", "§" + " Glossary"
    cited = tmp_path / "cited.py"
    cited.write_text(f'"""See {old_name} §4 and docs/algorithms.md {section}, {unnamed} and §0."""\n')
    sections = headings("# Title\n## §0 Notation\n## §4 Quorum and grace window\n")
    assert sections == {"0": "Notation", "4": "Quorum and grace window"}
    assert unresolved_citations([cited], sections) == [f"{cited}:1: {section}", f"{cited}:1: {unnamed}"]
    assert broken_doc_paths([cited], root=tmp_path) == [
        f"{cited}:1: {old_name}",
        f"{cited}:1: docs/algorithms.md",
    ]


def test_architecture_names_every_subpackage() -> None:
    folders = subpackages(ROOT / "p2p_trainer")
    assert {"algo", "train", "exchange", "net", "run", "lab"} <= set(folders)
    assert unnamed_folders(ARCHITECTURE.read_text(encoding="utf-8"), folders) == []


def test_the_architecture_check_catches_a_missing_folder() -> None:
    assert unnamed_folders("`algo/` and `lab/chaos/`; see also sim/", ["algo", "lab/chaos", "lab/sim"]) == [
        "lab/sim"
    ]
