"""``python -m fvlib patch --json``: the model's key-patching heatmap beside both theory references
of fvlib.theory.patching_policies, ``theory_loss`` (aware) and ``theory_loss_unaware``."""

import json

import pytest
import torch

from fvlib.cli import main
from fvlib.priors import TreePrior
from fvlib.theory import theory_patching_sweep
from fvlib.training import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

#: A tiny model A at a configuration the book does not train: depth 3, N = 24, sigma = 0.2, 8 steps.
TINY = TrainConfig(model="A", prior="tree", depth=3, alpha=0.6, n_ctx=24, noise_std=0.2, budget=3, steps=8,
                   batch=32, queries=8, width=16, eval_every=8, eval_contexts=32, device="cpu")
CONTEXTS = 150


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    run = tmp_path_factory.mktemp("patch") / "A"
    train(TINY, out_dir=run, progress=False)
    return run


def test_patch_json_returns_both_references(patched, capsys):
    code = main(["patch", "--run", str(patched), "--contexts", str(CONTEXTS), "--seed", "2", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    aware, unaware = torch.tensor(result["theory_loss"]), torch.tensor(result["theory_loss_unaware"])
    assert aware.shape == unaware.shape == torch.tensor(result["loss"]).shape == (3, 3)
    after = torch.ones(3, 3, dtype=torch.bool).triu(1)  # l > m
    assert ((unaware - aware).abs()[after] > 1e-6).all(), (aware, unaware)
    assert torch.equal(aware[:, 0], unaware[:, 0])  # layer 1 measures the root in both
    tree = TreePrior(3, 0.6)
    for reference, loss in (("aware", aware), ("unaware", unaware)):
        sweep = theory_patching_sweep(tree, 24, 0.2, 3, contexts=CONTEXTS, seed=2, reference=reference)
        assert torch.allclose(loss, sweep.loss.float(), rtol=1e-6), reference
