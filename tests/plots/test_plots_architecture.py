"""fvlib.plots.architecture: the block diagram and the parameter counts."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from fvlib import TreePrior  # noqa: E402
from fvlib.models import model_a, model_b, model_c  # noqa: E402
from fvlib.plots.architecture import draw_architecture, parameter_counts  # noqa: E402


def teardown_function():
    plt.close("all")


@pytest.mark.parametrize("layers", [1, 3])
def test_diagram_has_one_router_pool_and_slot_per_layer(layers):
    fig, ax, boxes = draw_architecture(layers, title="t")
    assert len(boxes["router"]) == len(boxes["pool"]) == len(boxes["workspace"]) == layers
    for key in ("tokens", "decoder", "readout"):
        assert boxes[key] in ax.patches
    assert any("readout" in t.get_text() for t in ax.texts)


def test_diagram_rejects_bad_layers():
    with pytest.raises(ValueError):
        draw_architecture(0)


def test_parameter_counts_match_formulas():
    tree = TreePrior(3, 0.5)
    D, M, w = tree.dim, 3, 8
    mlp = lambda n_in, n_out: n_in * w + w + w * w + w + w * n_out + n_out  # noqa: E731
    a = parameter_counts(model_a(tree, M, width=w))
    assert a["router"] == M * D + sum(mlp((l - 1), D) for l in range(2, M + 1))
    assert a["decoder"] == mlp(M, D) and a["total"] == a["router"] + a["decoder"]
    assert parameter_counts(model_b(tree, M, width=w))["router"] == M * D
    assert parameter_counts(model_c(tree, M, width=w)) == {"router": M * D, "decoder": M * D, "total": 2 * M * D}
