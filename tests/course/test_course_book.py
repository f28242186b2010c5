"""The course module's pages: exercises, hidden solutions, cross-references, the toc part and
the problem-set notebook conventions (no execution here; nbval runs the notebooks)."""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
COURSE = BOOK / "course"
PROBLEM_SETS = sorted(COURSE.glob("problem_set_*.ipynb"))
_SPEC = importlib.util.spec_from_file_location("sync_colab_cells", ROOT / "scripts" / "sync_colab_cells.py")
sync_colab_cells = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sync_colab_cells)
#: The book's install cell (one source of truth: scripts/sync_colab_cells.py).
COLAB_CELL = sync_colab_cells.install_cell_source(ROOT)

OPTIONS = r"((?:[ \t]*:[\w-]+:.*\n)*)"
EXERCISE = re.compile(r"^(?:`{3,}|:{3,})\{exercise\}[^\n]*\n" + OPTIONS, re.M)
SOLUTION = re.compile(r"^(?:`{3,}|:{3,})\{(?:solution|solution-start)\}[ \t]+(\S+)[^\n]*\n" + OPTIONS, re.M)
REF = re.compile(r"\{ref\}`([^`]+)`")
PRF_REF = re.compile(r"\{prf:ref\}`([^`]+)`")
DOC = re.compile(r"\{doc\}`([^`]+)`")


def _source_files():
    skip = {"_build", ".fvlib_runs", ".ipynb_checkpoints"}
    for path in sorted(BOOK.rglob("*")):
        if path.suffix in (".md", ".ipynb") and not skip & set(path.parts):
            yield path


def _markdown(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def _option(block: str, name: str) -> str | None:
    match = re.search(rf"^[ \t]*:{name}:[ \t]*(.*)$", block, re.M)
    return match.group(1).strip() if match else None


def _target(ref: str) -> str:
    match = re.search(r"<([^>]+)>\s*$", ref)
    return (match.group(1) if match else ref).strip()


@pytest.fixture(scope="module")
def book():
    texts = {path: _markdown(path) for path in _source_files()}
    exercises, solutions, labels, prf_labels = {}, {}, set(), set()
    for path, text in texts.items():
        labels.update(re.findall(r"^\(([^()\s]+)\)=\s*$", text, re.M))
        for match in EXERCISE.finditer(text):
            label = _option(match.group(1), "label")
            if label:
                assert label not in exercises, f"exercise label {label} is used twice"
                exercises[label] = path
        for match in SOLUTION.finditer(text):
            solutions.setdefault(match.group(1), []).append(_option(match.group(2), "class") or "")
        for match in re.finditer(r"^(?:`{3,}|:{3,})\{(prf:\w+)\}[^\n]*\n" + OPTIONS, text, re.M):
            label = _option(match.group(2), "label")
            if label:
                prf_labels.add(label)
        for match in re.finditer(r"^[ \t]*:(?:label|name):[ \t]*(\S+)", text, re.M):
            labels.add(match.group(1))
        if path.suffix == ".ipynb":
            for cell in nbformat.read(path, as_version=4).cells:
                name = cell.metadata.get("mystnb", {}).get("figure", {}).get("name")
                if name:
                    labels.add(name)
    return {"texts": texts, "exercises": exercises, "solutions": solutions,
            "labels": labels | set(exercises), "prf": prf_labels}


def test_enough_labelled_exercises(book):
    assert len(book["exercises"]) >= 20, sorted(book["exercises"])
    course = [label for label in book["exercises"] if label.startswith("ex-ps")]
    assert 6 <= len(course) <= 12, course


def test_every_exercise_has_a_hidden_solution(book):
    for label, path in book["exercises"].items():
        classes = book["solutions"].get(label)
        assert classes, f"{label} ({path.name}) has no solution block"
        assert all("dropdown" in c.split() for c in classes), f"{label}: solution not hidden by default ({classes})"
    orphans = set(book["solutions"]) - set(book["exercises"])
    assert not orphans, f"solutions without an exercise: {orphans}"


@pytest.mark.parametrize("name", ["index.md", "syllabus.md", "instructor_notes.md", "projects.md"]
                         + [p.name for p in PROBLEM_SETS])
def test_course_cross_references_exist(book, name):
    path = COURSE / name
    text = book["texts"][path]
    refs = [_target(r) for r in REF.findall(text)]
    assert refs, f"{name} has no {{ref}} at all"
    missing = [r for r in refs if r not in book["labels"]]
    assert not missing, f"{name}: unknown {{ref}} targets {missing}"
    missing_prf = [r for r in PRF_REF.findall(text) if _target(r) not in book["prf"]]
    assert not missing_prf, f"{name}: unknown {{prf:ref}} targets {missing_prf}"
    for doc in DOC.findall(text):
        target = (path.parent / _target(doc)).resolve()
        assert target.with_suffix(".md").exists() or target.with_suffix(".ipynb").exists(), f"{name}: {{doc}} {doc}"


def test_syllabus_has_seven_sessions_with_three_exercises_each(book):
    text = book["texts"][COURSE / "syllabus.md"]
    sessions = re.split(r"^### Session \d+", text, flags=re.M)[1:]
    assert len(sessions) == 7
    for number, body in enumerate(sessions, start=1):
        for part in ("Learning objectives", "Read", "In class", "Problems"):
            assert re.search(rf"^{part}\n:", body, re.M), f"session {number} lacks '{part}'"
        problems = body.split("\nProblems\n", 1)[1]
        exercises = {_target(r) for r in REF.findall(problems) if _target(r).startswith("ex-")}
        assert len(exercises) >= 3, f"session {number} lists {len(exercises)} exercises"


def test_problem_sets_follow_the_notebook_conventions(book):
    assert len(PROBLEM_SETS) == 3
    for path in PROBLEM_SETS:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "python3"
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        assert code[0].source == COLAB_CELL, path.name
        assert code[0].metadata.get("tags") == ["remove-cell"], path.name
        assert all(not cell.get("outputs") for cell in code), f"{path.name} has stored outputs"
        text = book["texts"][path]
        chapter_refs = {_target(r) for r in REF.findall(text) if re.match(r"ex-(?!ps)", _target(r))}
        assert len(chapter_refs) >= 3, f"{path.name} points to {len(chapter_refs)} chapter exercises"
        # each new problem: exercise, student template, dropdown solution with a check, a hidden assert
        cells = nb.cells
        for i, cell in enumerate(cells):
            if cell.cell_type == "markdown" and "{exercise}" in cell.source:
                template = cells[i + 1]
                assert template.cell_type == "code" and 'raise NotImplementedError("Student exercise' in template.source
                assert re.search(r"^# check_\w+\(", template.source, re.M), "the check call must be commented out"
                assert "{solution-start}" in cells[i + 2].source
                solution, hidden = cells[i + 3], cells[i + 4]
                assert "hide-input" in solution.metadata.get("tags", []) and "check_" in solution.source
                assert hidden.metadata.get("tags") == ["remove-cell"] and hidden.source.startswith("assert ")


def test_toc_has_the_course_part_between_outlook_and_appendices():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    captions = [part["caption"] for part in toc["parts"]]
    index = captions.index("Course module")
    assert captions[index - 1] == "Outlook" and captions[index + 1] == "Appendices"
    files = {entry["file"] for entry in toc["parts"][index]["chapters"]}
    on_disk = {f"book/course/{p.stem}" for p in COURSE.iterdir() if p.suffix in (".md", ".ipynb")}
    assert files == on_disk
