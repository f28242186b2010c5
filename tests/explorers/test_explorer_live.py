"""fvlib.explorers.live and the explorers' live grids: the page shows the numbers the widget shows.

Two kinds of check. On explorer outputs (always run): the grid embedded in an explorer's HTML
view is compared, at sampled grid points, with what the ipywidgets explorer computes after its
controls are set to those values (``explorer.summary``). On the built book (``_build/html``,
from ``make book``; skipped without it, a failure when ``CI`` is set): every page's embedded
data and code stay under 1.5 MB, and sampled states of the prior, strategy and training
explorers are recomputed with their compute functions and compared with the page.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from fvlib import TreePrior
from fvlib.explorers import live, states
from fvlib.explorers.dp_policy import dp_policy_explorer
from fvlib.explorers.layer_split import layer_split_explorer
from fvlib.explorers.patching import patching_explorer
from fvlib.explorers.prior import prior_explorer
from fvlib.explorers.strategy import strategy_explorer
from fvlib.explorers.training import training_explorer
from fvlib.plots.training import theory_label

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
STATIC = ROOT / "_static"
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
PAGE_LIMIT = 1.5e6  # bytes of embedded data + live code per page


def _close(embedded, computed, digits=4, path="state"):
    """``embedded`` (rounded to ``digits`` significant digits) equals ``computed``."""
    if isinstance(computed, dict):
        for key, value in computed.items():
            assert key in embedded, f"{path}: {key} missing"
            _close(embedded[key], value, digits, f"{path}.{key}")
    elif isinstance(computed, (list, tuple)):
        assert len(embedded) == len(computed), f"{path}: length {len(embedded)} != {len(computed)}"
        for i, (a, b) in enumerate(zip(embedded, computed)):
            _close(a, b, digits, f"{path}[{i}]")
    elif isinstance(computed, float):
        assert embedded == pytest.approx(computed, rel=10 ** (1 - digits), abs=1e-12), path
    else:
        assert embedded == computed, path


# ---------------------------------------------------------------------------------------
# fvlib.explorers.live
# ---------------------------------------------------------------------------------------
def test_control_default_must_be_a_value():
    with pytest.raises(ValueError, match="0.3"):
        live.Control("alpha", "alpha", (0.25, 0.5), 0.3)
    with pytest.raises(ValueError, match="no values"):
        live.Control("alpha", "alpha", (), 0.3)


def test_rounded_keeps_digits_and_drops_non_finite():
    assert live.rounded({"a": [1.23456789, float("nan")], "b": np.float64(2.0) * 1 / 3}, 3) == {
        "a": [1.23, None], "b": 0.667}
    assert live.rounded(torch.tensor([0.5, 1.0])) == [0.5, 1.0]
    with pytest.raises(ValueError, match="object"):
        live.rounded(object())


def test_grid_states_keys_view_controls_and_missing_points():
    controls = (live.Control("n", "n", (1, 2, 3), 2), live.Control("name", "name", ("a", "b"), "a"),
                live.Control("zoom", "zoom", (0.5, 1.0), 1.0, grid=False))
    calls = []

    def compute(n, name):
        calls.append((n, name))
        return None if (n, name) == (3, "b") else {"value": n / 3, "name": name}

    data = live.grid_states(live.LiveSpec("demo", controls, compute, digits=3))
    assert len(calls) == 6  # the view control is not a grid dimension
    assert set(data["states"]) == {"1|a", "1|b", "2|a", "2|b", "3|a"}
    assert data["states"]["1|b"] == {"value": 0.333, "name": "b"}
    assert [c["keys"] for c in data["controls"]] == [["1", "2", "3"], ["a", "b"], ["0.5", "1"]]
    assert data["controls"][1]["select"] and not data["controls"][0]["select"]
    assert live.state_key({"n": 2, "name": "b", "zoom": 0.5}, controls) == "2|b"


def test_live_block_survives_html_and_reads_back():
    spec = live.LiveSpec("demo", (live.Control("n", "n", (1,), 1),),
                         lambda n: {"text": "</script><!-- <b>"})
    block = live.live_block(spec)
    assert block.count("</script>") == 1 and "<!--" not in block
    (data,) = live.embedded_specs(f"<p>before</p>{block}<p>after</p>")
    assert data["states"]["1"]["text"] == "</script><!-- <b>" and data["kind"] == "demo"


def test_live_enabled_reads_the_environment(monkeypatch):
    monkeypatch.delenv(live.LIVE_ENV, raising=False)
    assert not live.live_enabled()
    monkeypatch.setenv(live.LIVE_ENV, "1")
    assert live.live_enabled()
    monkeypatch.setenv(live.LIVE_ENV, "0")
    assert not live.live_enabled()


def test_the_book_build_sets_the_environment():
    """_ext/fvlib_live.py (loaded by _config.yml) is what turns the grids on in the build."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"]["fvlib_live"] == "_ext/"
    source = (ROOT / "_ext" / "fvlib_live.py").read_text()
    assert f'LIVE_ENV = "{live.LIVE_ENV}"' in source
    assert (STATIC / "fvlib-live.js").exists() and (STATIC / "fvlib-live.css").exists()


# ---------------------------------------------------------------------------------------
# Explorer outputs: the embedded grid against the widget itself
# ---------------------------------------------------------------------------------------
def _set(explorer, values):
    for name, value in values.items():
        explorer.controls[name].value = value


def _sample_keys(data, n, seed=0):
    keys = sorted(data["states"])
    return random.Random(seed).sample(keys, min(n, len(keys)))


def _values_of(key, data):
    grid = [c for c in data["controls"] if c["grid"]]
    parts = key.split("|")
    return {c["name"]: c["values"][c["keys"].index(part)] for c, part in zip(grid, parts)}


def test_html_view_is_static_unless_live(monkeypatch):
    monkeypatch.delenv(live.LIVE_ENV, raising=False)
    explorer = prior_explorer(depth=3)
    assert live.embedded_specs(explorer._repr_mimebundle_()["text/html"]) == []
    monkeypatch.setenv(live.LIVE_ENV, "1")
    (data,) = live.embedded_specs(explorer._repr_mimebundle_()["text/html"])
    assert data["kind"] == "prior"


@pytest.mark.slow  # the whole grid of the prior explorer (about 20 s)
def test_prior_grid_matches_the_widget():
    explorer = prior_explorer(depth=4, alpha=0.5, seed=0)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    grid = states.PRIOR_GRID
    assert len(data["states"]) == len(grid["depth"]) * len(grid["alpha"]) * len(grid["seed"])
    for key in _sample_keys(data, 6) + ["4|0.5|0"]:
        _set(explorer, _values_of(key, data))
        _close(data["states"][key], explorer.summary, data["digits"], key)
    assert data["states"]["4|0.5|0"]["nonzero"] == 4


def test_strategy_grid_matches_the_widget_at_every_budget(monkeypatch):
    monkeypatch.setattr(states, "STRATEGY_GRID", {"alpha": (0.5, 1.0), "n_ctx": (32,), "noise_std": (0.0, 1.0)})
    explorer = strategy_explorer(depth=3, budget=3, alpha=0.5, n_ctx=32, samples=100)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    assert set(data["states"]) == {"0.5|32|0", "0.5|32|1", "1|32|0", "1|32|1"}
    budget = data["controls"][0]
    assert budget["name"] == "budget" and not budget["grid"] and budget["values"] == list(range(1, 8))
    for key, m in [("0.5|32|0", 2), ("1|32|1", 5), ("0.5|32|1", 7)]:
        _set(explorer, _values_of(key, data) | {"budget": m})
        state = data["states"][key]
        # the page shows the first m budgets of the embedded curves: the widget's own numbers
        for name in states.EXPLORER_STRATEGIES:
            _close(state["mean"][name][:m], explorer.summary["mean"][name], data["digits"], key)
            _close(state["stderr"][name][:m], explorer.summary["stderr"][name], data["digits"], key)
        _close(state["tau2"], explorer.summary["tau2"], data["digits"])


def test_training_grid_is_the_recorded_runs(tmp_path):
    from fvlib.training import TrainConfig, run_dir_for, train

    base = TrainConfig(model="A", depth=3, budget=3, n_ctx=32, steps=100, batch=32, queries=4, width=16,
                       eval_every=50, eval_contexts=64, device="cpu", router_warm_start=0)
    for model in ("A", "C"):
        config = TrainConfig.from_dict(base.to_dict() | {"model": model})
        train(config, out_dir=run_dir_for(config, tmp_path), progress=False)
    explorer = training_explorer(base=base, run_root=tmp_path, reference_samples=200)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    assert set(data["states"]) == {"A|tree", "C|tree"}  # B was never trained; only the tree prior
    assert [c["values"] for c in data["controls"]] == [["A", "B", "C"], ["tree"], [0, 50, 100]]
    for model in ("A", "C"):
        explorer.controls["model"].value = model
        state, summary = data["states"][f"{model}|tree"], explorer.summary
        _close(state["loss"], [h["eval_excess_loss"] for h in summary["history"]], data["digits"])
        _close(state["steps"], [h["step"] for h in summary["history"]])
        _close(state["theory"], summary["theory"], data["digits"])
        assert state["theory_name"] == summary["theory_name"]
        assert state["theory_label"] == theory_label(summary["theory_name"])  # the figure's legend text


def test_patching_grid_matches_the_widget():
    explorer = patching_explorer(TreePrior(3, 0.5), contexts=60, layer=2)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    assert set(data["states"]) == {f"{m}|{l}" for m in (1, 2, 3) for l in (1, 2, 3)}
    for key in ("1|2", "3|1", "2|3"):
        _set(explorer, _values_of(key, data))
        _close(data["states"][key], {k: explorer.summary[k] for k in
                                     ("ratio", "row", "target_overlap", "donor_overlap")}, data["digits"], key)
    ratio = data["shared"]["ratio"]["theory"]
    assert data["states"]["1|2"]["row"] == ratio[0]


# ---------------------------------------------------------------------------------------
# The built book
# ---------------------------------------------------------------------------------------
def _built_pages():
    if not (HTML / "index.html").exists():
        if IN_CI:
            pytest.fail(f"{HTML} has no index.html (CI is set): run `make book` first")
        pytest.skip(f"{HTML} has no index.html: run `make book` first")
    pages = {}
    for path in sorted(HTML.rglob("*.html")):
        specs = live.embedded_specs(path.read_text(encoding="utf-8"))
        if specs:
            pages[path.relative_to(HTML).as_posix()] = specs
    return pages


def _embedded_bytes(page: str) -> int:
    import re

    blocks = re.findall(r'<script type="application/json" class="fvlib-live-data">.*?</script>', page, re.S)
    return sum(len(b.encode()) for b in blocks)


def test_built_pages_hold_the_six_explorers_within_the_size_limit():
    pages = _built_pages()
    kinds = {spec["kind"] for specs in pages.values() for spec in specs}
    assert {"prior", "strategy", "training", "patching", "dp_policy", "layer_split"} <= kinds, kinds
    code = sum((HTML / "_static" / name).stat().st_size for name in ("fvlib-live.js", "fvlib-live.css"))
    for name in pages:
        size = _embedded_bytes((HTML / name).read_text(encoding="utf-8")) + code
        print(f"{name}: {size / 1e6:.3f} MB of embedded data and live code")
        assert size <= PAGE_LIMIT, f"{name}: {size} bytes of embedded data and code"


def _spec(kind):
    for name, specs in _built_pages().items():
        for spec in specs:
            if spec["kind"] == kind:
                return name, spec
    pytest.fail(f"no {kind} explorer in the built book")


def test_built_prior_explorer_recomputes():
    _, data = _spec("prior")
    for key in _sample_keys(data, 5, seed=1):
        _close(data["states"][key], states.prior_state(**_values_of(key, data)), data["digits"], key)


def test_built_strategy_explorer_recomputes():
    _, data = _spec("strategy")
    torch.set_num_threads(1)
    shared, budgets = data["shared"], data["controls"][0]["values"]
    # the cheapest grid points (short contexts), at a budget below the largest (a prefix)
    keys = sorted(data["states"], key=lambda k: (int(_values_of(k, data)["n_ctx"]), k))[:2]
    for key in keys:
        state = data["states"][key]
        m = budgets[len(budgets) // 2]
        computed = states.strategy_state(shared["depth"], m, **_values_of(key, data), samples=state["samples"],
                                          seed=shared["seed"])
        for name in shared["strategies"]:
            _close(state["mean"][name][:m], computed["mean"][name], data["digits"], key)


def test_built_training_explorer_is_the_recorded_runs():
    from fvlib.experiments.beside_theory import theory_reference
    from fvlib.experiments.inbuild import shared_configs
    from fvlib.training import load_history, run_dir_for

    _, data = _spec("training")
    configs = shared_configs()
    for key, state in sorted(data["states"].items()):
        model, prior = key.split("|")
        config = configs[(model, prior)]
        history = load_history(run_dir_for(config, ROOT / "book" / ".fvlib_runs"))
        _close(state["loss"], [h["eval_excess_loss"] for h in history], data["digits"], key)
        if model == "A":  # one theory reference per prior is enough (a Monte Carlo estimate)
            reference = theory_reference(config, samples=state["theory_samples"] or 2000)
            _close(state["theory"], reference["value"], data["digits"], key)
    assert json.dumps(data["shared"])  # plain data


def test_dp_policy_grid_matches_the_widget():
    explorer = dp_policy_explorer(tau=0.6)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    from fvlib.explorers.states import DP_POLICY_GRID

    assert len(data["states"]) == len(DP_POLICY_GRID["tau"])
    for key in ["0.6"] + _sample_keys(data, 2, seed=3):
        _set(explorer, _values_of(key, data))
        _close(data["states"][key], explorer.summary, data["digits"], key)


def test_layer_split_grid_matches_the_widget():
    explorer = layer_split_explorer(budget=6, layers=2, alpha=0.5)
    (data,) = live.embedded_specs(explorer.static_html(live=True))
    from fvlib.explorers.states import LAYER_SPLIT_GRID

    pairs = [(m, n) for m in LAYER_SPLIT_GRID["budget"] for n in LAYER_SPLIT_GRID["layers"] if n <= m]
    assert len(data["states"]) == len(pairs) * len(LAYER_SPLIT_GRID["alpha"])  # never more layers than budget
    assert all(int(key.split("|")[1]) <= int(key.split("|")[0]) for key in data["states"])
    assert next(c for c in data["controls"] if c["name"] == "layers")["at_most"] == "budget"
    for key in ["6|2|0.5"] + _sample_keys(data, 5, seed=4):
        _set(explorer, _values_of(key, data))
        _close(data["states"][key], explorer.summary, data["digits"], key)
    assert data["states"]["6|2|0.5"]["tree_loss"] == 0.0625 and data["states"]["6|2|0.5"]["gaussian_loss"] == 0.25
