"""Which theory reference a key-patching heatmap follows (fvlib.interventions.reference_distances,
issue 43 item 2): the RMS distance over the cells after the split, its bootstrap standard error
over the donor/target pairs, and the verdict; and the per-pair errors the sweeps keep for it."""

import math

import pytest
import torch

from fvlib import TreePrior, make_generator
from fvlib.interventions import key_patching_sweep, reference_distances
from fvlib.models import make_model
from fvlib.theory import PatchingResult, theory_patching_references, theory_patching_sweep

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TREE = TreePrior(3, 0.5)
N, PAIRS = 32, 200


@pytest.fixture(scope="module")
def references():
    """The aware and unaware greedy heatmaps at K = L = 3, N = 32 on 200 pairs (seed 0)."""
    return theory_patching_references(TREE, N, 0.0, 3, contexts=PAIRS, seed=0)


def _heatmap(errors: torch.Tensor) -> PatchingResult:
    """A heatmap made of the per-pair errors ``(K, L, n)`` alone (the other fields unused)."""
    K, L, n = errors.shape
    loss = errors.mean(-1)
    return PatchingResult(baseline=0.0, baseline_stderr=0.0, baseline_by_level=torch.zeros(K), loss=loss,
                          stderr=errors.std(-1) / math.sqrt(n), donor_loss=loss, n_contexts=n, errors=errors)


def test_sweeps_keep_the_errors_of_every_pair(references):
    alone = theory_patching_sweep(TREE, N, 0.0, 3, contexts=PAIRS, seed=0, reference="unaware")
    assert alone.errors.shape == (3, 3, PAIRS)
    assert torch.allclose(alone.errors.mean(-1), alone.loss)
    # the joint pass of both references keeps each one's own columns
    assert torch.equal(references["unaware"].errors, alone.errors)
    assert not torch.equal(references["aware"].errors, alone.errors)


def test_a_reference_follows_itself(references):
    aware = references["aware"]
    out = reference_distances(aware, references, resamples=200)
    assert out.distance["aware"] == 0.0 and out.stderr["aware"] == 0.0
    assert out.distance["unaware"] > 0
    assert out.follows == "aware" and out.difference > 2 * out.difference_stderr
    swapped = reference_distances(references["unaware"], references, resamples=200)
    assert swapped.follows == "unaware" and swapped.difference < 0


def test_two_equal_references_give_between(references):
    same = {"one": references["aware"], "two": references["aware"]}
    out = reference_distances(references["unaware"], same, resamples=50)
    assert out.follows == "between" and out.difference == 0.0


def test_bootstrap_error_matches_the_paired_standard_error():
    # K = L = 2 has one cell after the split, (m, l) = (1, 2): the distance is |mean(a - b)|,
    # whose standard error, far from 0, is sd(a - b) / sqrt(n)
    gen, n = make_generator(5), 4000
    a = torch.rand(2, 2, n, generator=gen, dtype=torch.float64) + 1.0
    b = a + 0.5 + 0.3 * torch.randn(2, 2, n, generator=gen, dtype=torch.float64)
    c = a - 2.0 + 0.1 * torch.randn(2, 2, n, generator=gen, dtype=torch.float64)
    out = reference_distances(_heatmap(a), {"b": _heatmap(b), "c": _heatmap(c)}, resamples=2000, seed=1)
    expected = float((a - b)[0, 1].std() / math.sqrt(n))
    assert out.distance["b"] == pytest.approx(float((b - a)[0, 1].mean()), rel=1e-12)
    assert out.stderr["b"] == pytest.approx(expected, rel=0.1)
    assert out.follows == "b"


def test_a_model_heatmap_is_compared_on_its_own_pairs(references):
    model = make_model("A", TREE, budget=3, width=16).double()
    sweep = key_patching_sweep(model, TREE, N, 0.0, contexts=PAIRS, seed=0)
    out = reference_distances(sweep, references, resamples=100)
    assert set(out.distance) == {"aware", "unaware"} and out.follows in ("aware", "unaware", "between")
    assert all(s > 0 for s in out.stderr.values())


@pytest.mark.parametrize("change, match", [
    (lambda r, refs: (r, {"aware": refs["aware"]}), "two names"),
    (lambda r, refs: (PatchingResult(**{**vars(r), "errors": None}), refs), "per-pair errors"),
    (lambda r, refs: (_heatmap(r.errors[:, :, :10]), refs), "same shape"),
    (lambda r, refs: (_heatmap(r.errors[:, :1]), {k: _heatmap(v.errors[:, :1]) for k, v in refs.items()}),
     "no cell"),
])
def test_bad_arguments_are_named(references, change, match):
    result, refs = change(references["aware"], references)
    with pytest.raises(ValueError, match=match):
        reference_distances(result, refs, resamples=10)
    with pytest.raises(ValueError, match="resamples"):
        reference_distances(references["aware"], references, resamples=1)

