"""Patching ratios and summaries (fvlib.interventions), heatmaps and transplant panels
(fvlib.plots.interventions), workspace projections (fvlib.interventions.probes)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pytest  # noqa: E402
import torch  # noqa: E402

from fvlib import TreePrior  # noqa: E402
from fvlib.interventions import (  # noqa: E402
    TransplantResult,
    patching_ratio,
    patching_summary,
    transplant_workspace,
)
from fvlib.models import model_a  # noqa: E402
from fvlib.plots.interventions import (  # noqa: E402
    plot_patching_heatmap,
    plot_patching_pair,
    plot_transplant,
)
from fvlib.theory import PatchingResult, theory_patching_sweep  # noqa: E402


def teardown_function():
    plt.close("all")


def _fake(K=3, L=3):
    base = torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64)[:K]
    loss = base[:, None].repeat(1, L).clone()
    loss[0, 1:] = 1.0  # after the split at m = 1
    loss[1, 2] = 2.0  # after the split at m = 2
    return PatchingResult(
        baseline=float(base.mean()),
        baseline_stderr=0.01,
        baseline_by_level=base,
        loss=loss,
        stderr=torch.full((K, L), 0.01, dtype=torch.float64),
        donor_loss=loss.clone(),
        n_contexts=10,
    )


def test_ratio_and_summary():
    r = _fake()
    ratio = patching_ratio(r)
    assert ratio.shape == (3, 3)
    assert np.allclose(np.diag(ratio), 1.0)
    s = patching_summary(r)
    assert math.isclose(s["after"], np.mean([10.0, 10.0, 10.0]))
    assert math.isclose(s["before"], 1.0) and math.isclose(s["at"], 1.0)
    assert s["max_z_not_after"] == 0.0 and s["max_rel_not_after"] == 0.0


def test_heatmap_and_pair_draw():
    r = _fake()
    image = plot_patching_heatmap(r, title="x")
    assert image.get_array().shape == (3, 3)
    assert len(image.axes.texts) == 9
    fig, axes = plot_patching_pair(r, r)
    assert len(axes) == 2 and all(len(ax.images) == 1 for ax in axes)


def test_heatmap_of_losses_annotates_the_losses_and_names_bad_values():
    r = _fake()
    image = plot_patching_heatmap(r, value="loss", colorbar=True)
    assert np.allclose(image.get_array(), np.asarray(r.loss))
    assert [t.get_text() for t in image.axes.texts][:3] == [f"{v:.2g}" for v in np.asarray(r.loss)[0]]
    assert image.axes.figure.axes[-1].get_ylabel() == "patched excess loss"
    with pytest.raises(ValueError, match="'losses'"):
        plot_patching_heatmap(r, value="losses")


def test_panels_share_one_colour_scale_and_refuse_bad_input():
    from fvlib.plots.interventions import plot_patching_panels

    r = _fake()
    fig, axes = plot_patching_panels({"a": r, "b": r, "c": r}, value="loss", title="t")
    assert len(axes) == 3 and fig._suptitle.get_text() == "t"
    limits = {(ax.images[0].norm.vmin, ax.images[0].norm.vmax) for ax in axes}
    loss = np.asarray(r.loss)
    assert limits == {(loss[loss > 0].min(), loss.max())}
    with pytest.raises(ValueError, match="at least one"):
        plot_patching_panels({})
    with pytest.raises(ValueError, match="'ratios'"):
        plot_patching_panels({"a": r}, value="ratios")


def test_heatmap_writes_huge_ratios_as_powers_of_ten():
    from fvlib.plots.interventions import _cell_text

    assert [_cell_text(v, "ratio") for v in (2.345, 345.6, 3.2e8)] == ["2.3", "346", "3e+08"]


def test_theory_sweep_is_flat_before_the_split_and_plots():
    tree = TreePrior(3, 0.5)
    r = theory_patching_sweep(tree, 64, 0.0, n_layers=3, contexts=200, seed=1)
    s = patching_summary(r)
    assert s["after"] > 2 and s["max_rel_not_after"] < 0.2
    plot_patching_heatmap(r)


def test_transplant_panels():
    tree = TreePrior(3, 0.5)
    model = model_a(tree, budget=3, width=16)
    t = transplant_workspace(model, tree, 32, 0.0, contexts=50, seed=0)
    assert isinstance(t, TransplantResult)
    fig, axes = plot_transplant(t)
    assert len(axes) == 3
    assert all(len(ax.lines) == 4 for ax in axes)


def test_workspace_projections_and_probe_heatmap():
    from fvlib import make_generator, sample_task
    from fvlib.interventions import ProbeResult
    from fvlib.interventions.probes import workspace_projections
    from fvlib.plots.interventions import plot_probe_heatmap, plot_workspace_projections, prefix_index

    tree = TreePrior(3, 0.5)
    model = model_a(tree, budget=3, width=16)
    batch = sample_task(tree, 40, 32, 0.0, make_generator(0))
    proj = workspace_projections(model, batch)
    assert [p["coords"].shape for p in proj] == [(40, 1), (40, 2), (40, 2)]
    assert all(0.99 < p["explained"].sum() <= 1.0 + 1e-9 for p in proj[:2])
    assert list(prefix_index(np.array([[1, -1, 1], [-1, -1, 1]]), 2)) == [2, 0]
    fig, axes = plot_workspace_projections(proj, batch.signs.numpy())
    assert len(axes) == 3 and all(len(ax.collections) == 1 for ax in axes)
    r = ProbeResult(accuracy=torch.full((3, 3), 0.7, dtype=torch.float64), kind="linear", n_train=1, n_test=1)
    image = plot_probe_heatmap(r)
    assert image.get_array().shape == (3, 3)
