"""fvlib.plots.explorers: the explorers' figures drawn by a chapter from the same results, and
fvlib.plots.style: one palette, one set of strategy labels."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fvlib import GaussianPrior, TreePrior, make_generator  # noqa: E402
from fvlib.interventions import patch_level_effect  # noqa: E402
from fvlib.plots import channel, decay, explorers, interventions, style, training, trees  # noqa: E402
from fvlib.theory import theory_patching_sweep  # noqa: E402
from fvlib.theory.sweeps import decay_sweep  # noqa: E402
from fvlib.training import TrainConfig  # noqa: E402


def test_one_palette_and_one_set_of_labels():
    assert isinstance(style.OKABE_ITO, dict) and len(style.OKABE_ITO) == 8
    for module in (channel, decay, interventions, training, trees, explorers):
        assert getattr(module, "OKABE_ITO", style.OKABE_ITO) is style.OKABE_ITO
    assert channel.STRATEGY_LABELS is style.STRATEGY_LABELS is explorers.STRATEGY_LABELS
    assert training.MODEL_COLORS is style.MODEL_COLORS is explorers.MODEL_COLORS
    assert style.palette("blue", "vermillion") == ("#0072B2", "#D55E00")
    assert training.THEORY_STYLES["lmmse"]["label"] == "theory: " + style.STRATEGY_LABELS["lmmse"]


def test_strategy_curves_from_a_chapter_sweep():
    tree = TreePrior(3, 0.5)
    sweep = decay_sweep(tree, 64, 0.0, [1, 2], samples=40, seed=0,
                        strategies=("adaptive_greedy", "nonadaptive_coord", "lmmse"))
    fig = explorers.plot_strategy_curves(sweep, tree)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == [style.STRATEGY_LABELS[n] for n in ("adaptive_greedy", "nonadaptive_coord", "lmmse")]
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 2]
    assert ticks == [1, 2]  # budgets are counts: no tick at 1.5


def test_prior_sample_into_a_pyplot_figure():
    tree = TreePrior(3, 0.5)
    gen = make_generator(0)
    signs = tree.sample_signs(1, gen)[0]
    twin = GaussianPrior.twin_of(tree).sample(1, gen)[0]
    fig = plt.figure(figsize=(8, 3))
    assert explorers.plot_prior_sample(tree, signs, tree.theta_from_signs(signs), twin, figure=fig) is fig
    assert len(fig.axes) == 2
    plt.close(fig)


def test_training_run_and_patching_cell():
    cfg = TrainConfig(model="C", prior="tree", depth=3, budget=3, steps=100)
    fig = explorers.plot_training_run(cfg, [], {"name": "lmmse", "value": 0.1}, "not trained")
    assert len(fig.axes) == 1 and fig.axes[0].get_lines()
    tree = TreePrior(3, 0.5)
    sweeps = {"theory": theory_patching_sweep(tree, 32, 0.0, 3, contexts=20)}
    effect = patch_level_effect(tree, 32, 0.0, split_level=1, layer=2, n_layers=3, contexts=20)
    fig = explorers.plot_patching_cell(sweeps, effect)
    assert len(fig.axes) == 3 and "greedy theory policy" in fig.axes[0].get_title()


def _node_ids(ax):
    """The heap-id texts of a drawn tree and their boxes on the canvas."""
    renderer = ax.figure.canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_text().isdigit()]
    return texts, [t.get_window_extent(renderer) for t in texts]


def test_prior_tree_ids_never_overlap_at_any_depth():
    """Deep levels of a K = 6 or 7 tree have no room for every id: those are left out (smaller
    nodes instead), the rest do not overlap; a tree up to K = 5 shows every id."""
    gen = make_generator(0)
    for depth in range(2, 8):
        tree = TreePrior(depth, 0.5)
        signs = tree.sample_signs(1, gen)[0]
        fig = explorers.plot_prior_sample(tree, signs, tree.theta_from_signs(signs), tree.theta_from_signs(signs))
        FigureCanvasAgg(fig).draw()  # the boxes as the PNG has them
        texts, boxes = _node_ids(fig.axes[0])
        if depth <= 5:
            assert sorted(int(t.get_text()) for t in texts) == list(range(tree.dim))
        else:
            assert 15 <= len(texts) < tree.dim
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), f"K = {depth}: node ids overlap"
