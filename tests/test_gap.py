"""Which half of model A falls short: its router with the exact Bayes decoder (chapter 8), and
``python -m fvlib gap``, the gap table of a trained run as JSON."""

import json
import math

import pytest
import torch

from fvlib import TreePrior, make_generator, sample_task
from fvlib.cli import main
from fvlib.cli.dispatch import GAP_ROWS
from fvlib.analysis import gap_table, router_bayes_decode, router_directions, router_policy_alignment
from fvlib.theory.adaptive_opt import FixedRows, GreedyRule
from fvlib.models import FVTransformer, model_a, model_config
from fvlib.training import TrainConfig, load_run, train

pytestmark = pytest.mark.usefixtures("one_thread")


def _model_and_batch(budget=3, contexts=300, seed=0):
    torch.manual_seed(seed)
    tree = TreePrior(3, 0.5)
    model = model_a(tree, budget, width=16)
    batch = sample_task(tree, contexts, 64, 0.1, make_generator(seed))
    return tree, model, batch


def test_router_rows_reproduce_the_workspace():
    tree, model, batch = _model_and_batch()
    rows = router_directions(model, batch)
    assert rows.shape == (batch.batch_size, 3, tree.dim)
    _, cache = model.run_with_cache(batch, names_filter="blocks.3.hook_workspace")
    readings = torch.einsum("bmd,bd->bm", rows, batch.to("cpu", torch.float64).sufficient_statistic())
    assert torch.allclose(readings, cache["blocks.3.hook_workspace"].double(), atol=1e-4)


def test_bayes_decoder_beats_an_untrained_decoder():
    # the untrained decoder outputs 0 (its last layer starts at zero): loss = E|theta|^2
    tree, model, batch = _model_and_batch()
    out = router_bayes_decode(model, tree, batch)
    assert out["contexts"] == batch.batch_size
    assert out["model"][0] == pytest.approx(tree.energy, rel=1e-6)
    assert out["router_bayes"][0] < 0.8 * out["model"][0]


def test_router_directions_need_a_gated_router():
    tree = TreePrior(3, 0.5)
    config = model_config("A", tree, 2)
    model = FVTransformer(type(config)(**{**config.to_dict(), "router": "linear"}))
    batch = sample_task(tree, 8, 16, 0.0, make_generator(0))
    with pytest.raises(ValueError, match="gated"):
        router_directions(model, batch)


def test_gap_table_rows():
    tree, model, _ = _model_and_batch(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=600, seed=1)
    for row in ("adaptive_greedy", "nonadaptive_opt", "adaptive_opt", "model", "router_bayes",
                "adaptive_greedy_paired", "adaptive_opt_paired"):
        mean, stderr = table[row]
        assert 0 <= mean and 0 <= stderr < mean
    # the paired rows: the same policies on other contexts (the model rows'), so other numbers
    # that agree within Monte Carlo error
    for row in ("adaptive_greedy", "adaptive_opt"):
        (m1, s1), (m2, s2) = table[row], table[row + "_paired"]
        assert m1 != m2 and abs(m1 - m2) < 4 * (s1**2 + s2**2) ** 0.5, row
    if table["adaptive_opt_kind"] == "greedy":
        assert table["adaptive_opt_paired"] == table["adaptive_greedy_paired"]
    best = min(table["adaptive_greedy"][0], table["nonadaptive_opt"][0])
    assert table["adaptive_opt"][0] <= best + 3 * max(table["adaptive_greedy"][1], table["nonadaptive_opt"][1])
    assert table["adaptive_opt_kind"] in ("learned", "greedy", "nonadaptive_opt")
    with pytest.raises(ValueError, match="tree"):
        gap_table(model, TrainConfig(prior="gaussian-twin", depth=3, budget=2), contexts=10)


@pytest.mark.slow  # Monte Carlo over the gap table (about 20 s)
def test_gap_table_others_share_the_contexts():
    """A second model decoded on the same contexts: its rows equal the table of that model alone."""
    tree, model, _ = _model_and_batch(budget=2)
    other = FVTransformer(model.config)
    other.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():   # another model: every weight moved (the decoder's last layer too)
        for p in other.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    both = gap_table(model, config, contexts=300, seed=2, others={"new": other})
    alone = gap_table(other, config, contexts=300, seed=2)
    assert both["new"] == alone["model"] and both["new_router_bayes"] == alone["router_bayes"]
    assert both["model"] != both["new"]
    for bad in ("model", "adaptive_greedy", 3):
        with pytest.raises(ValueError, match="others"):
            gap_table(model, config, contexts=50, others={bad: other})


def test_alignment_with_the_routers_own_rows():
    """An untrained router's first rows are fixed: a FixedRows policy of exactly those rows aligns
    perfectly at layer 1; the greedy rule (coordinates) aligns with a generic row only in part."""
    tree, model, batch = _model_and_batch(budget=3, contexts=64)
    rows = router_directions(model, batch)
    own = FixedRows(rows[0] / rows[0].norm(dim=-1, keepdim=True))
    align = router_policy_alignment(model, tree, batch, own)
    assert align.shape == (3,) and align[0] == pytest.approx(1.0, abs=1e-6)
    assert ((0 <= align) & (align <= 1 + 1e-9)).all()
    greedy = router_policy_alignment(model, tree, batch, GreedyRule(tree))
    assert greedy[0] < 0.99
    wide = FVTransformer(model_config("B", tree, 3))
    with pytest.raises(ValueError, match="channel"):
        router_policy_alignment(wide, tree, batch, own)


def test_paired_ratio():
    from fvlib.stats import paired_ratio

    gen = torch.Generator().manual_seed(0)
    b = torch.rand(5000, generator=gen, dtype=torch.float64) ** 4   # a heavy-ish tail
    assert paired_ratio(b, b) == (1.0, 0.0)
    ratio, stderr = paired_ratio(2 * b, b)
    assert ratio == pytest.approx(2.0) and stderr == pytest.approx(0.0, abs=1e-12)
    # correlated pairs: a far smaller error than the two means' own errors suggest
    a = 1.3 * b + 0.01 * torch.rand(5000, generator=gen, dtype=torch.float64)
    ratio, stderr = paired_ratio(a, b)
    unpaired = ratio * ((a.std() / a.mean()) ** 2 + (b.std() / b.mean()) ** 2).sqrt() / 5000**0.5
    assert abs(ratio - 1.3 - 0.005 / b.mean()) < 0.01 and 0 < stderr < 0.2 * unpaired
    # against resampling: the spread of the ratio over independent halves
    halves = [paired_ratio(a[i::10], b[i::10])[0] for i in range(10)]
    assert torch.tensor(halves).std() / 10**0.5 == pytest.approx(stderr, rel=0.6)
    with pytest.raises(ValueError, match="same n"):
        paired_ratio(a, b[:10])


def test_gap_table_ratios_are_paired():
    tree, model, _ = _model_and_batch(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=600, seed=1)
    best = table[table["best_paired"]][0]
    assert best == min(table["adaptive_greedy_paired"][0], table["adaptive_opt_paired"][0])
    for row in ("model", "router_bayes"):
        ratio, stderr = table["ratios"][row]
        assert ratio == pytest.approx(table[row][0] / best) and 0 < stderr < ratio


# ----------------------------------------------------------------------------------------
# python -m fvlib gap
# ----------------------------------------------------------------------------------------
TINY = TrainConfig(model="A", prior="tree", depth=3, alpha=0.5, n_ctx=32, noise_std=0.1, budget=3, steps=40,
                   batch=32, queries=16, width=32, eval_every=40, eval_contexts=64, device="cpu")
CONTEXTS = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny trained model A on the tree, and runs the gap table does not apply to."""
    root = tmp_path_factory.mktemp("gap")
    configs = {"A": TINY, "B": TrainConfig(**{**TINY.to_dict(), "model": "B", "steps": 5}),
               "A-gaussian": TrainConfig(**{**TINY.to_dict(), "prior": "gaussian-twin", "steps": 5}),
               "transformer": TrainConfig(**{**TINY.to_dict(), "arch": "transformer", "inputs": "tokens", "steps": 5})}
    for name, config in configs.items():
        train(config, out_dir=root / name, progress=False)
    return root


def _gap(capsys, *argv):
    code = main(["gap", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_gap_json_is_the_library_gap_table(runs, capsys):
    """Every key is there, each number is the one gap_table gives for the run on the same
    contexts, and the ratios are the model (and its router + Bayes decoder) over the better
    paired reference, context by context."""
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", str(CONTEXTS), "--seed", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(GAP_ROWS) <= set(result) and set(result["stderr"]) == set(GAP_ROWS)
    assert {"best_paired", "ratio", "ratio_stderr", "router_bayes_ratio", "router_bayes_ratio_stderr"} <= set(result)
    assert (result["contexts"], result["seed"]) == (CONTEXTS, 3)
    model, config, _ = load_run(runs / "A")
    table = gap_table(model, config, contexts=CONTEXTS, seed=3)
    for row in GAP_ROWS:
        assert (result[row], result["stderr"][row]) == pytest.approx(table[row], rel=1e-9)
        assert result[row] > 0 and result["stderr"][row] > 0
    paired = ("adaptive_greedy_paired", "adaptive_opt_paired")
    assert result["best_paired"] == min(paired, key=lambda row: result[row]) == table["best_paired"]
    best = result[result["best_paired"]]
    assert result["ratio"] == pytest.approx(result["model"] / best, rel=1e-9)
    assert result["router_bayes_ratio"] == pytest.approx(result["router_bayes"] / best, rel=1e-9)
    assert (result["ratio"], result["ratio_stderr"]) == pytest.approx(table["ratios"]["model"], rel=1e-9)
    assert result["ratio_stderr"] > 0 and result["router_bayes_ratio_stderr"] > 0


def test_gap_without_json_is_a_short_table(runs, capsys):
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", "100")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) <= 10 and any("best paired" in line and "+-" in line for line in lines)


def test_gap_json_holds_null_not_nan(runs, capsys, monkeypatch):
    import fvlib.analysis as analysis

    def with_a_nan(*args, **kwargs):
        table = gap_table(*args, **kwargs)
        return {**table, "router_bayes": (table["router_bayes"][0], math.nan)}

    monkeypatch.setattr(analysis, "gap_table", with_a_nan)
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", "100", "--json")
    assert code == 0, err

    def refuse(constant):
        raise ValueError(f"bare {constant} in the JSON")

    result = json.loads(out, parse_constant=refuse)
    assert result["stderr"]["router_bayes"] is None and result["stderr"]["model"] > 0


@pytest.mark.parametrize("name, needle", [("B", "model B"), ("A-gaussian", "gaussian-twin"),
                                          ("transformer", "transformer")])
def test_gap_of_another_run_is_one_line(runs, capsys, name, needle):
    code, out, err = _gap(capsys, "--run", str(runs / name), "--json")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0] and "model A" in lines[0]


@pytest.mark.parametrize("argv, needle", [(["--contexts", "1"], "--contexts"), (["--contexts", "x"], "'x'"),
                                          (["--seed", "-1"], "--seed"), (["--bogus"], "--bogus"), ([], "--run")])
def test_gap_bad_flags_are_one_line(runs, capsys, argv, needle):
    run = ["--run", str(runs / "A")] if argv else []
    code, out, err = _gap(capsys, *run, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0]


def test_gap_of_a_missing_run_is_one_line(tmp_path, capsys):
    code, out, err = _gap(capsys, "--run", str(tmp_path / "nowhere"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--run" in lines[0] and "nowhere" in lines[0]


def test_greedy_paired_is_on_the_evaluate_contexts():
    from fvlib.analysis import greedy_paired
    from fvlib.stats import paired_ratio
    from fvlib.training import evaluate
    tree, model, _ = _model_and_batch(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    out = greedy_paired(model, config, contexts=700, seed=4)
    ev = evaluate(model, tree, 64, 0.1, contexts=700, seed=4)
    assert out["contexts"] == 700
    assert out["model_loss"] == pytest.approx(ev["excess_loss"], rel=1e-12)
    assert out["model_stderr"] == pytest.approx(ev["stderr"], rel=1e-12)
    assert out["ratio"] == pytest.approx(out["model_loss"] / out["greedy_loss"], rel=1e-9)
    # the untrained model predicts 0 (loss E|theta|^2), far above greedy with two reads
    assert out["ratio"] > 2 and out["ratio_stderr"] > 0
    # another seed: other contexts, so another greedy loss
    assert greedy_paired(model, config, contexts=700, seed=5)["greedy_loss"] != out["greedy_loss"]
    with pytest.raises(ValueError, match="tree"):
        greedy_paired(model, TrainConfig(depth=3, budget=2, prior="gaussian-twin", steps=1),
                      contexts=10, seed=0)
    with pytest.raises(ValueError):
        greedy_paired(model, config, contexts=1, seed=0)


def test_greedy_paired_takes_a_standard_transformer():
    """A standard transformer predicts y at its query tokens, not theta_hat: its paired loss is
    evaluate()'s (the query error against <theta, x_q>), beside greedy on the same contexts."""
    from fvlib.analysis import greedy_paired
    from fvlib.training import build_model, evaluate
    config = TrainConfig(arch="transformer", model="A", depth=3, budget=2, n_ctx=16, noise_std=0.0, steps=1,
                         width=16)
    model = build_model(config)
    tree = TreePrior(3, config.alpha)
    out = greedy_paired(model, config, contexts=300, seed=4)
    ev = evaluate(model, tree, 16, 0.0, contexts=300, seed=4)
    assert out["contexts"] == 300 and out["model_loss"] == pytest.approx(ev["excess_loss"], rel=1e-12)
    assert out["ratio"] == pytest.approx(out["model_loss"] / out["greedy_loss"], rel=1e-9)
