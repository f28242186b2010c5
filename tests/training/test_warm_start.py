"""The router warm start at the greedy policy (fvlib.training.warm_start) and its TrainConfig fields."""

import dataclasses

import pytest
import torch

from fvlib.models import model_a, model_b
from fvlib.priors import TreePrior
from fvlib.task import make_generator, sample_task
from fvlib.theory import channel_tau2
from fvlib.training import ORIGINAL_RECIPE, TrainConfig, build_model, parameter_groups, run_dir_for, train
from fvlib.training.warm_start import greedy_targets, router_imitation_loss, warm_start_router

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TREE = TreePrior(3, 0.5)
SMALL = TrainConfig(model="A", depth=3, n_ctx=32, budget=3, steps=30, batch=32, queries=8, width=16,
                    router_warm_start=200, eval_every=10, eval_contexts=64, checkpoint_every=10, device="cpu")


def _imitation(model, seed=1):
    batch = sample_task(TREE, 512, 32, 0.0, make_generator(seed))
    phis, rows = greedy_targets(TREE, batch.sufficient_statistic(), 3, channel_tau2(TREE, 32, 0.0))
    with torch.no_grad():
        return router_imitation_loss(model, phis, rows).item(), phis, rows


def test_greedy_targets_are_unit_coordinate_rows_along_the_path():
    batch = sample_task(TREE, 64, 32, 0.0, make_generator(0))
    phis, rows = greedy_targets(TREE, batch.sufficient_statistic(), 3, channel_tau2(TREE, 32, 0.0))
    assert phis.shape == (64, 3) and rows.shape == (64, 3, TREE.dim)
    assert torch.equal(rows.sum(-1), torch.ones(64, 3)) and torch.equal(rows.max(-1).values, torch.ones(64, 3))
    assert torch.equal(rows[:, 0, 0], torch.ones(64))   # the root first
    nodes = rows.argmax(-1)
    assert ((nodes[:, 1] == 1) | (nodes[:, 1] == 2)).all()   # then a child of the root (heap order)
    assert torch.allclose(phis, torch.einsum("bld,bd->bl", rows, batch.sufficient_statistic().double()))


def test_warm_start_fits_the_router_to_greedy_and_leaves_the_decoder():
    torch.manual_seed(0)
    model = model_a(TREE, 3, width=16)
    decoder = {k: v.clone() for k, v in model.decoder.state_dict().items()}
    before, phis, rows = _imitation(model)
    last = warm_start_router(model, TREE, 32, 0.0, steps=600, batch=64, generator=make_generator(0))
    after, _, _ = _imitation(model)
    assert after < 0.05 * before and last < 0.1 * before, (before, after, last)
    # layer 1 measures the root: its row is within a few percent of e_0
    row = model.block(1).router.base[0].detach()
    assert (row - torch.eye(TREE.dim)[0]).norm() < 0.1, row
    assert all(torch.equal(v, decoder[k]) for k, v in model.decoder.state_dict().items())


def test_warm_start_rejects_what_it_cannot_fit():
    gen = make_generator(0)
    with pytest.raises(ValueError, match="gated router, one channel"):
        warm_start_router(model_b(TREE, 3), TREE, 32, 0.0, steps=1, batch=4, generator=gen)
    with pytest.raises(ValueError, match="D = 7"):
        warm_start_router(model_a(TreePrior(2, 0.5), 2), TREE, 32, 0.0, steps=1, batch=4, generator=gen)
    for name, kwargs in (("steps", dict(steps=0, batch=4)), ("batch", dict(steps=1, batch=0)),
                         ("lr", dict(steps=1, batch=4, lr=-1.0))):
        with pytest.raises(ValueError, match=name):
            warm_start_router(model_a(TREE, 3), TREE, 32, 0.0, generator=gen, **kwargs)


def test_which_configs_warm_start():
    assert SMALL.warm_starts
    assert not dataclasses.replace(SMALL, router_warm_start=0).warm_starts
    assert not dataclasses.replace(SMALL, model="B").warm_starts
    assert not dataclasses.replace(SMALL, prior="gaussian-twin").warm_starts
    assert not dataclasses.replace(SMALL, arch="transformer").warm_starts
    assert not TrainConfig(**ORIGINAL_RECIPE).warm_starts
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="router_warm_start"):
            dataclasses.replace(SMALL, router_warm_start=bad)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="router_lr_scale"):
            dataclasses.replace(SMALL, router_lr_scale=bad)


def test_router_fields_name_the_run_only_where_they_act():
    plain = dataclasses.replace(SMALL, model="B")
    assert run_dir_for(plain, "r") == run_dir_for(dataclasses.replace(plain, router_warm_start=0,
                                                                       router_lr_scale=1.0), "r")
    assert run_dir_for(SMALL, "r") != run_dir_for(dataclasses.replace(SMALL, router_lr_scale=0.5), "r")
    assert run_dir_for(SMALL, "r") != run_dir_for(dataclasses.replace(SMALL, router_warm_start=100), "r")


def test_a_run_that_does_not_warm_start_resumes_whatever_its_warm_start_fields(tmp_path):
    """A model B run saved when the defaults had a warm start (600 steps, scale 0.1: inert for
    B) is the run of the same config under the teacher-free defaults: same directory, reloaded
    rather than refused. Where the fields act (model A on the tree) a change is refused."""
    from fvlib.training import RunDirError

    old_b = dataclasses.replace(SMALL, model="B", steps=5, router_warm_start=600, router_lr_scale=0.1)
    new_b = dataclasses.replace(old_b, router_warm_start=0, router_lr_scale=1.0)
    assert run_dir_for(old_b, "r") == run_dir_for(new_b, "r")
    first = train(old_b, out_dir=tmp_path / "b", progress=False)
    again = train(new_b, out_dir=tmp_path / "b", progress=False)
    assert again.final_loss == first.final_loss and again.history == first.history
    train(dataclasses.replace(SMALL, steps=5), out_dir=tmp_path / "a", progress=False, until_step=2)
    with pytest.raises(RunDirError, match="another config: router_warm_start 0 here"):
        train(dataclasses.replace(SMALL, steps=5, router_warm_start=0), out_dir=tmp_path / "a", progress=False)


def test_configs_saved_before_the_warm_start_load_without_it():
    saved = {k: v for k, v in SMALL.to_dict().items() if k not in ("router_warm_start", "router_lr_scale")}
    assert TrainConfig.from_dict(saved).router_warm_start == 0
    assert TrainConfig.from_dict({"model": "A"}).router_warm_start == SMALL.__class__().router_warm_start


def test_parameter_groups_scale_the_router():
    model = build_model(SMALL)
    groups = parameter_groups(model, SMALL)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [g["lr_scale"] for g in groups] == [SMALL.router_lr_scale, 1.0]
    assert all(names[id(p)].startswith("blocks.") for p in groups[0]["params"])
    assert all(names[id(p)].startswith("decoder") for p in groups[1]["params"])
    assert sum(len(g["params"]) for g in groups) == len(names)
    no_warm = dataclasses.replace(SMALL, router_warm_start=0)
    assert [g["lr_scale"] for g in parameter_groups(model, no_warm)] == [1.0]


def test_a_warm_started_run_resumes_bit_for_bit(tmp_path):
    whole = train(SMALL, progress=False)
    train(SMALL, out_dir=tmp_path, progress=False, until_step=10)
    resumed = train(SMALL, out_dir=tmp_path, progress=False)
    assert resumed.final_loss == whole.final_loss
    for name, weight in whole.model.state_dict().items():
        assert torch.equal(weight, resumed.model.state_dict()[name]), name

