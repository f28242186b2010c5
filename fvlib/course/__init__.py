"""Automatic checks for the course module's problem sets.

Each ``check_*`` function takes a student's *function* (or, where it says so, a computed
value), runs it on a few seeded random inputs, compares the answers with fvlib's reference
implementation and returns a :class:`CheckResult`. A result is truthy when the answer is
right; it prints (and renders in a notebook) as ``Correct: ...`` or
``Not yet: <what differs, where>; hint: <the likely mistake>``. Where a wrong answer matches a
known misconception (``tau`` instead of ``tau^2``, greedy instead of optimal, a layer index
off by one, ...), the hint names it.

Every check is data: a ``Check`` holds its cases, its reference, how an answer is read
and compared, and its list of ``Misconception`` rows; one runner executes them all
(``fvlib.course.engine``). To add a recognised mistake, add a row to the check's
misconception table, in the module of its topic.

Two kinds of bad input are told apart:

* misuse of the check itself (not a function where one is needed, a bad depth or noise
  level) raises ``ValueError`` naming the bad value;
* a student function that raises, returns the wrong type or shape, or returns ``NaN`` gives a
  *failed* :class:`CheckResult` that says so. Nothing the student function does escapes as a
  traceback.

Conventions (as in the rest of fvlib; see the book's appendix *Conventions*):

* Tree prior in heap order: root 0, children of ``n`` are ``2n+1`` (sign -1) and ``2n+2``
  (sign +1); level ``k`` holds nodes ``2^k - 1 .. 2^(k+1) - 2``; ``D = 2^K - 1``. Leaves are
  indexed ``0 .. 2^K - 1`` reading the sign path as binary digits (``+1`` is 1), most
  significant first, as in :attr:`fvlib.priors.TreePrior.all_signs` (section "The tree prior
  and its indexing").
* Gaussian channel: a measurement of node ``a`` is ``phi ~ N(theta[a], tau2)``; ``tau2`` is a
  *variance* (:func:`fvlib.theory.closed_forms.channel_tau2`; section "Measurements and the
  channel").
* Patching heatmaps: ``loss[m - 1, l - 1]``, rows split levels ``m = 1..K`` (the first level at
  which donor and target paths visit different nodes), columns layers ``l = 1..L`` (1-based,
  as in the hook names ``blocks.{l}``); see :mod:`fvlib.theory.patching` (section "Donor, target and
  the split level").

Every check is fast (well under a second with fvlib's reference solutions) and deterministic
for a given ``seed``.

The modules, in layers from the bottom up; a module imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    engine      the check engine: CheckResult, checks as data (Check, Misconception) and the one
                runner, reading and comparing a student's answers
    channel, statistic, posterior, gaussian, greedy, noisefree, dp, patching
                one topic each: the channel noise tau^2, the pooled statistic, the exact tree
                posterior, the Gaussian posterior, the greedy action, the noise-free closed
                forms, the DP value, the key-patching heatmap

Every check and :class:`CheckResult` are importable from ``fvlib.course``; the default cases of a
check are its topic's (``fvlib.course.dp.DP_CASES``, ``fvlib.course.patching.PATCHING_CASES``).
"""

from .channel import check_channel_tau2
from .dp import check_dp_value
from .engine import CheckResult
from .gaussian import check_gaussian_posterior
from .greedy import check_greedy_action
from .noisefree import check_noisefree_loss
from .patching import check_patching_sweep
from .posterior import check_posterior
from .statistic import check_sufficient_statistic

__all__ = [
    "CheckResult",
    "check_channel_tau2",
    "check_sufficient_statistic",
    "check_posterior",
    "check_gaussian_posterior",
    "check_greedy_action",
    "check_noisefree_loss",
    "check_dp_value",
    "check_patching_sweep",
]
