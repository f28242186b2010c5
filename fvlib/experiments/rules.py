"""The rules of the stored experiments, each stated in words beside the function that applies it.

* **Convergence**, by the rule an experiment's definition names (:data:`CONVERGENCE_RULES`,
  :func:`convergence_text`): a run that has not converged is trained again from the start with
  twice the steps, at most :data:`MAX_DOUBLINGS` times (:func:`may_double`,
  :func:`runs_to_double`; :func:`doubling_gain`: what a doubling bought).

  - ``last-fifth`` (the seven older stored files, read by the appendix *How the experiments were
    run* and chapter 11; :data:`CONVERGENCE_DROP`,
    :func:`last_fifth_drop`, :func:`converged`): the evaluation loss fell by less than 2% over
    the last fifth of the steps.
  - ``paired-doubling`` (:func:`paired_drop`, :func:`paired_converged`): every run trains ``S``
    and ``2S`` steps at least; after each doubling the per-context excess losses of the previous
    attempt's final model ``e_prev`` and of this attempt's ``e_this``, on the same evaluation
    contexts, give the paired drop ``d = mean(e_prev - e_this)`` and its standard error ``SE``;
    the run converged at the previous attempt's steps iff ``d < 0.02 L(prev) + 2 SE``
    (:data:`PAIRED_RELATIVE_DROP`, :data:`PAIRED_STDERRS`).
* **Tolerances** of the verification: :data:`PREFIX_RULE` (the quick check, :data:`PREFIX_RTOL`),
  :data:`TOLERANCE_RULE` (a retrained run, :func:`tolerance`, :data:`FINAL_RTOL`), :data:`THEORY_TOLERANCE_RULE`
  (the references; the strategies that choose: :func:`~fvlib.theory.strategies.choosing_strategies`).
* **Failure** (:data:`FAILURE_RULE`, :func:`failed`).

Every result file states the rules it was written under (:mod:`fvlib.experiments.records`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..families import get_family
from ..stats import mean_and_stderr

__all__ = [
    "CONVERGENCE_DROP",
    "CONVERGENCE_RULES",
    "PAIRED_RELATIVE_DROP",
    "PAIRED_STDERRS",
    "FAILURE_COORD_FRACTION",
    "FINAL_RTOL",
    "FAILURE_RULE",
    "MAX_DOUBLINGS",
    "PREFIX_RTOL",
    "PREFIX_RULE",
    "THEORY_TOLERANCE_RULE",
    "TOLERANCE_RULE",
    "converged",
    "convergence_text",
    "doubling_gain",
    "failed",
    "last_fifth_drop",
    "may_double",
    "paired_converged",
    "paired_drop",
    "point_of",
    "runs_to_double",
    "tolerance",
]

#: A run whose loss still falls this much (relative) over its last fifth is not converged.
CONVERGENCE_DROP = 0.02


#: The convergence rules an experiment's definition may name
#: (:attr:`~fvlib.experiments.definitions.Experiment.convergence`; module docs).
CONVERGENCE_RULES = ("last-fifth", "paired-doubling")


#: The relative term of the paired-doubling rule (a doubling that lowered the loss by less than this
#: fraction of the previous attempt's loss, plus :data:`PAIRED_STDERRS` standard errors, bought nothing).
PAIRED_RELATIVE_DROP = 0.02


#: The paired-doubling rule's noise term, in standard errors of the paired drop.
PAIRED_STDERRS = 2.0


#: How many times :func:`~fvlib.experiments.runner.run` doubles the steps of a run that has not converged.
MAX_DOUBLINGS = 2


#: The quick check's relative tolerance (:data:`PREFIX_RULE`). Early training is where float
#: rounding is amplified most: the first evaluation (step 150) of depth-sweep-k7's model A at
#: M = 2, seed 0, is 0.5228 stored, 0.488 retrained alone, 0.475 in a stack of two and 0.528 in a
#: stack of three, on two AMD EPYC machines (up to 9%); a stored transformer A' (transformers-k4)
#: lands 6% away on another CPU. A change to what the models compute moves it far more: the gated
#: router's forward without its gate (one line) raises the first evaluation of the quick check's
#: runs of model A by 38% to 95% (tests/experiments/test_verify.py).
PREFIX_RTOL = 0.15


#: How :func:`~fvlib.experiments.verify.verify`'s quick check judges a retrained prefix (stored in every result file).
PREFIX_RULE = (
    "the quick check retrains, for each model family of the file (A, B, C, A', B', open A'), its cheapest "
    "stored run of two layers or more (so that a router reads the workspace; any run where the family has "
    "none) from its stored config up to its first evaluation after step 0 (a twentieth of its steps), "
    "alone, and compares the evaluation losses at step 0 and "
    "at that step with the stored history: each within the relative tolerance prefix_rtol that the "
    "experiment's definition states ({rtol:g} here), not one computed from the stored numbers")


#: The relative tolerance of a retrained run's final loss (:data:`TOLERANCE_RULE`), unless an
#: experiment's definition states another (:attr:`~fvlib.experiments.definitions.Experiment.final_rtol`).
#: The last full verification on an AMD EPYC (after training moved to the pooled statistic) gave
#: retrained against stored final losses 0.451231/0.451238, 0.440817/0.440707, 0.453137/0.452729,
#: 0.0062133/0.00614653 (1.1%), 0.115828/0.112715 (2.7%, a standard transformer),
#: 0.105043/0.105054 and 0.380099/0.380099: 5% holds the worst of them with room to spare, and a
#: stored loss changed by 10% is caught.
FINAL_RTOL = 0.05


#: How :func:`~fvlib.experiments.verify.verify` judges a retrained run (stored in every result file;
#: ``{rtol}``: the experiment's ``final_rtol``).
TOLERANCE_RULE = (
    "|retrained - stored| <= final_rtol * |stored|, with the relative tolerance final_rtol that the "
    "experiment's definition states ({rtol:g} here), never one computed from the stored numbers: a rerun "
    "of a stored config on the same CPU gives the same bits, on another CPU it differs in the last bits, "
    "which training amplifies (up to 2.7% seen)")


#: How :func:`~fvlib.experiments.verify.theory_differences` compares a stored reference value with its re-evaluation
#: (stored in every result file).
THEORY_TOLERANCE_RULE = (
    "the references are re-evaluated from the experiment's definition with the optimised parameters "
    "stored beside the file (NAME.theory.safetensors: nonadaptive_opt's directions and adaptive_opt's "
    "policies, each the best of optimiser_starts starts by its loss on held-out contexts of "
    "selection_seed) on the stored Monte Carlo seeds: a number of a policy that chooses its "
    "measurements from the context (adaptive_greedy, adaptive_opt, or a reference of that name) "
    "must land within 3 of its stored standard errors, a standard error within 10% of itself "
    "(another CPU can break a near tie of a choice differently in a few contexts); every other "
    "number (fixed directions or coordinates, LMMSE, closed forms, counts) within a relative 1e-6; "
    "every name must be the same. A re-optimisation (verify's full check) lands in another local "
    "optimum on another CPU: it is reported with its CPU, never judged")


#: When a stored run counts as failed (:func:`failed`; the book reports failures as such).
FAILURE_RULE = ("a tree-prior run of a model with a nonlinear decoder (A, B, A', B') fails when its final loss is "
                "not at least 10% below the loss of measuring the first M coordinates in heap order (the "
                "theory's nonadaptive_coord, which needs no learned direction and no routing); a run of the "
                "linear model C, or any run on a Gaussian prior, fails when it is more than 1.5 times its "
                "matching reference (LMMSE on the tree, the budget's closed form on the twin)")


#: The fraction of the heap-order coordinate loss a tree run must end below (:data:`FAILURE_RULE`).
FAILURE_COORD_FRACTION = 0.9


def last_fifth_drop(history: Sequence[dict], steps: int) -> float:
    """How much the evaluation loss fell, relative, over the last fifth of ``steps``: from the
    last evaluation at or before step ``0.8 steps`` to the final one (``nan`` when the history
    does not reach ``steps`` or a loss is not finite)."""
    final = history[-1]
    if final["step"] != steps:
        return math.nan
    start = [h for h in history if h["step"] <= 0.8 * steps][-1]
    before, after = start["eval_excess_loss"], final["eval_excess_loss"]
    if not (math.isfinite(before) and math.isfinite(after)):
        return math.nan
    return 0.0 if before <= 0 else (before - after) / before


def doubling_gain(record: dict) -> float:
    """How much the run's last doubling lowered its final loss, relative: ``1 - last / previous``
    over its last two attempts (negative when the longer run ended higher; ``nan`` for a run
    trained once). It tells what more steps bought, where :func:`last_fifth_drop` also counts
    the fall of the loss while a cosine schedule anneals the learning rate to zero."""
    attempts = record["attempts"]
    if len(attempts) < 2:
        return math.nan
    return 1.0 - attempts[-1]["final_loss"] / attempts[-2]["final_loss"]


def converged(history: Sequence[dict], steps: int) -> bool:
    """``True`` when the evaluation loss fell by less than 2% over the last fifth of ``steps``
    (:func:`last_fifth_drop`)."""
    return bool(last_fifth_drop(history, steps) < CONVERGENCE_DROP)


def paired_drop(previous, this) -> tuple[float, float]:
    """The paired drop of a doubling and its standard error: ``d = mean(previous - this)`` over
    the contexts, ``SE = std(previous - this) / sqrt(n)`` (``ddof=1``).

    Args:
        previous, this: the per-context excess losses ``(n,)`` of the previous attempt's final
            model and of this attempt's, on the same evaluation contexts in the same order
            (tensors, arrays or sequences of numbers; ``n >= 2``).

    Raises:
        ValueError: vectors of other shapes, fewer than two contexts, or a value that is not finite.
    """
    previous = torch.as_tensor(previous, dtype=torch.float64)
    this = torch.as_tensor(this, dtype=torch.float64)
    if previous.dim() != 1 or previous.shape != this.shape or previous.numel() < 2:
        raise ValueError(f"paired_drop needs two loss vectors of one shape (n,) with n >= 2, got previous "
                         f"{tuple(previous.shape)} and this {tuple(this.shape)}")
    if not (torch.isfinite(previous).all() and torch.isfinite(this).all()):
        raise ValueError("paired_drop needs finite per-context losses, got a NaN or an infinity")
    drop, stderr = mean_and_stderr(previous - this)
    return float(drop), float(stderr)


def paired_converged(drop: float, drop_stderr: float, previous_loss: float) -> bool:
    """The paired-doubling rule: a run converged at the previous attempt's steps when its doubling
    lowered the loss by less than :data:`PAIRED_RELATIVE_DROP` of ``previous_loss`` (``L(prev)``,
    the previous attempt's final loss) plus :data:`PAIRED_STDERRS` standard errors of the paired
    drop (``drop``, ``drop_stderr``: :func:`paired_drop`)."""
    return bool(drop < PAIRED_RELATIVE_DROP * previous_loss + PAIRED_STDERRS * drop_stderr)


def convergence_text(rule: str, max_doublings: int) -> str:
    """The convergence rule ``rule`` (:data:`CONVERGENCE_RULES`) in words, as a result file states
    it (``rules/convergence``)."""
    if rule == "last-fifth":
        return (f"the evaluation loss fell by less than {CONVERGENCE_DROP:.0%} over the last fifth of the steps; "
                f"otherwise retrained with twice the steps, at most {max_doublings} times")
    if rule == "paired-doubling":
        return (f"every run trains S and 2S steps (from scratch each); on the same evaluation contexts the "
                f"per-context excess losses of the two final models give the paired drop d = L(S) - L(2S) and "
                f"its standard error SE; converged at S iff d < {PAIRED_RELATIVE_DROP:g} L(S) + "
                f"{PAIRED_STDERRS:g} SE; otherwise doubled again, at most {max_doublings} doublings; the "
                f"final numbers are the last attempt's; a run still improving after the last doubling is "
                f"stored as not converged (capped) with the drop its last doubling bought")
    raise ValueError(f"convergence must be one of {CONVERGENCE_RULES}, got {rule!r}")


def may_double(attempts: list, experiment) -> bool:
    """A run (its attempts so far) that has not converged and may be retrained with twice the
    steps: it had fewer doublings than the experiment allows."""
    return not attempts[-1]["converged"] and len(attempts) - 1 < experiment.max_doublings


def runs_to_double(data: dict, experiment) -> list[str]:
    """The keys of the stored runs that :func:`~fvlib.experiments.runner.run` would retrain with twice the steps: not
    converged, with fewer doublings than ``experiment.max_doublings`` (which a definition may
    raise after its runs were stored)."""
    return [k for k, r in data["runs"].items() if may_double(r["attempts"], experiment)]


def point_of(record: dict) -> tuple:
    """A stored run's point: ``(variant, prior, budget)``; its seeds are the runs of one point."""
    return (record["variant"], record["prior"], record["budget"])


def tolerance(experiment, record: dict) -> float:
    """How far a retrained run's final loss may land from ``record``'s (a stored run of
    ``experiment``, a :class:`~fvlib.experiments.definitions.Experiment`), by :data:`TOLERANCE_RULE`:
    the definition's ``final_rtol`` times the stored loss."""
    return experiment.final_rtol * abs(record["final_loss"])


def failed(data: dict, record: dict) -> bool:
    """``True`` when ``record`` (a run of ``data``) failed by :data:`FAILURE_RULE`."""
    theory = data["theory"] or {}
    config = record["config"]
    linear = get_family(config["arch"]).model_label(config["model"]) == "C"
    if record["prior"] == "tree" and not linear:
        kind = data["theory_kind"]
        if kind == "depth-sweep":
            coord = theory["curves"]["nonadaptive_coord"]["mean"][theory["budgets"].index(record["budget"])]
        elif kind == "per-budget":   # one task per budget (recipes-a)
            coord = theory[f"M{record['budget']}"]["nonadaptive_coord"]["mean"]
        else:
            coord = theory["tree"]["nonadaptive_coord"]["mean"]
        return not record["final_loss"] < FAILURE_COORD_FRACTION * coord
    if data["theory_kind"] == "depth-sweep":   # C's LMMSE curve, the twin's closed form per budget
        i = theory["budgets"].index(record["budget"])
        matching = theory["curves"]["lmmse"]["mean"][i] if record["prior"] == "tree" else theory["twin"][i]
    else:
        matching = theory[f"{config['model']}/{record['prior']}"]["value"]
    return not record["final_loss"] <= 1.5 * matching
