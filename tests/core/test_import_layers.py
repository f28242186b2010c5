"""fvlib's imports: no cycle, and every module imports only from the layers below it.

The layers are the ones documented in the docstrings of ``fvlib/__init__.py`` (the top-level
modules) and of the packages in :data:`LAYERED` (their submodules): a
literal block (after a line ending in ``::`` that speaks of layers) whose lines indented by four
spaces name the modules of one layer, comma-separated, from the bottom up (text after two
spaces, and lines indented further, describe the layer). Imports are read with ``ast`` from every
module, including the ones inside functions (a local import hides a cycle, it does not remove
it). Nothing is imported: the test reads the sources. The same reading checks that the explorers'
states and grids import no widget library, even through other fvlib modules, and that no
module imports another module's private (underscore) name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fvlib"


def _module_name(path: Path) -> str:
    parts = ("fvlib",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {name for name, p in MODULES.items() if p.name == "__init__.py"}


def _imports(name: str) -> set[str]:
    """The fvlib modules that module ``name`` imports, anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    package = name if name in PACKAGES else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # ``import fvlib.theory.dp as d`` etc.
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def _layers(package: str) -> list[list[str]]:
    """The layers documented in ``package``'s docstring, bottom first, as module names."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert doc, f"{package} has no docstring"
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.rstrip().endswith("::") and "layers" in " ".join(lines[max(0, i - 2):i + 1]).lower())
    layers = []
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        if not line.startswith("    "):
            break
        if line.startswith("     "):  # a description line, indented further
            continue
        names = re.split(r"\s{2,}", line.strip())[0]
        layers.append([f"{package}.{n.strip()}" for n in names.split(",")])
    return layers


LAYERED = ["fvlib", "fvlib.theory", "fvlib.training", "fvlib.interventions", "fvlib.experiments", "fvlib.plots",
           "fvlib.explorers", "fvlib.course", "fvlib.cli"]


def _unit(module: str, package: str) -> str | None:
    """The member of ``package`` that ``module`` belongs to (``fvlib.theory.dp`` -> ``fvlib.theory``
    for the package ``fvlib``), or ``None`` when it is outside the package or is the package."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1:].split(".")[0]


def test_fvlib_has_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name):
        state[name] = 1
        path.append(name)
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def test_the_graph_sees_local_imports_and_submodules():
    # the CLI's subcommands import what they run inside functions; theory/__init__ imports every submodule
    assert {"fvlib.theory", "fvlib.training", "fvlib.interventions"} <= GRAPH["fvlib.cli.dispatch"]
    assert "fvlib.experiments.reproduce" in GRAPH["fvlib.cli.dispatch"]
    assert {"fvlib.theory.dp", "fvlib.theory.strategies", "fvlib.theory.baselines"} <= GRAPH["fvlib.theory"]
    assert "fvlib.theory.posteriors" in GRAPH["fvlib.theory.dp"]


@pytest.mark.parametrize("package", LAYERED)
def test_the_documented_layers_cover_every_module(package):
    documented = [m for layer in _layers(package) for m in layer]
    assert len(documented) == len(set(documented)), f"{package}: a module is listed twice: {documented}"
    members = {_unit(m, package) for m in MODULES} - {None}
    assert set(documented) == members, (
        f"{package}'s docstring lists {sorted(set(documented) - members)} that do not exist and misses "
        f"{sorted(members - set(documented))}")


@pytest.mark.parametrize("package", LAYERED)
def test_every_module_imports_only_from_layers_below_it(package):
    level = {m: i for i, layer in enumerate(_layers(package)) for m in layer}
    wrong = []
    for name, deps in GRAPH.items():
        unit = _unit(name, package)
        if unit is None:
            continue
        for dep in deps:
            dep_unit = _unit(dep, package)
            if dep_unit is None:
                # outside the package, or the package itself: a member importing the package it
                # belongs to (its __init__, which imports every member) is a cycle in waiting
                if dep == package:
                    wrong.append(f"{name} imports its package {package}")
                continue
            if dep_unit != unit and level[dep_unit] >= level[unit]:
                wrong.append(f"{name} imports {dep} (layer {level[dep_unit]} >= its layer {level[unit]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_plots_computes_nothing():
    """fvlib.plots draws results: it imports no training, sampling or Monte Carlo layer."""
    computing = {"fvlib.training", "fvlib.task", "fvlib.experiments", "fvlib.models"}
    for name, deps in GRAPH.items():
        if name == "fvlib.plots" or name.startswith("fvlib.plots."):
            bad = {d for d in deps if any(d == c or d.startswith(c + ".") for c in computing)}
            assert not bad, f"{name} imports {sorted(bad)}"
            theory = {d for d in deps if d == "fvlib.theory" or d.startswith("fvlib.theory.")}
            assert not theory, f"{name} imports {sorted(theory)}"


def _private_imports(name: str, source: str | None = None) -> list[tuple[str, str]]:
    """``(source module, name)`` of every underscore-prefixed name that module ``name`` (its file,
    or ``source``) imports from another fvlib module (``from .x import _y``); a private *module*
    (``fvlib._checks``) is fine, its public names are its interface."""
    tree = ast.parse(source if source is not None else MODULES[name].read_text(), filename=name)
    package = name if name in PACKAGES else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module != "fvlib" and not module.startswith("fvlib."):
            continue
        out += [(module, a.name) for a in node.names
                if a.name.startswith("_") and f"{module}.{a.name}" not in MODULES]
    return out


def test_the_private_import_check_sees_private_names():
    source = ("from ..training.loop import _train_run, TrainConfig\nfrom .._checks import check_int\n"
              "from .. import _checks\nimport numpy as _np\nfrom torch import _C\n\n"
              "def f():\n    from ..hooks import _names_filter\n")
    assert _private_imports("fvlib.interventions.fake", source) == [
        ("fvlib.training.loop", "_train_run"), ("fvlib.hooks", "_names_filter")]


def test_no_module_imports_a_private_name_of_another():
    found = {(name, module, private) for name in MODULES for module, private in _private_imports(name)}
    wrong = sorted(found)
    assert not wrong, "private names imported across modules:\n" + "\n".join(
        f"{name} imports {private} from {module}" for name, module, private in wrong)


def _external_imports(name: str) -> set[str]:
    """The modules outside fvlib that module ``name`` imports anywhere in its source, as written
    (``ipywidgets``, ``tqdm.notebook``, ...)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
    return {m for m in out if m != "fvlib" and not m.startswith("fvlib.")}


def _reachable(name: str) -> set[str]:
    """``name`` and every fvlib module importing it imports, directly or not (with the packages
    above each: importing ``fvlib.plots.style`` runs ``fvlib/plots/__init__.py`` first)."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        todo += [m for m in (*GRAPH[module], *parents) if m in MODULES]
    return seen


WIDGET_LIBRARIES = ("ipywidgets", "tqdm.notebook")  # tqdm.notebook imports ipywidgets


@pytest.mark.parametrize("module", ["fvlib.explorers.states", "fvlib.explorers.live"])
def test_explorer_states_import_no_widget_library(module):
    """Computing an explorer's state (in a test, in the static book's build) needs no ipywidgets."""
    found = sorted(f"{m} imports {lib}" for m in _reachable(module) for lib in _external_imports(m)
                   if any(lib == w or lib.startswith(w + ".") for w in WIDGET_LIBRARIES))
    assert not found, f"{module} reaches a widget library: " + "; ".join(found)


def test_the_widget_check_sees_widget_libraries():
    assert "ipywidgets" in _external_imports("fvlib.explorers.base")
    # the states reach the layers they compute with, and the packages above them
    assert {"fvlib.theory.sweeps", "fvlib.explorers.live", "fvlib.plots", "fvlib.plots.explorers",
            "fvlib.training"} <= _reachable("fvlib.explorers.states")
