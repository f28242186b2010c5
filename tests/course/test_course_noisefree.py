"""fvlib.course.noisefree: the noise-free closed forms, right and wrong."""

import math

import pytest
from course_results import failed_with

from fvlib.course import check_noisefree_loss

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def adaptive_right(tree, L):
    return sum(tree.alpha**k for k in range(L, tree.depth))


def nonadaptive_right(tree, M):
    if M >= tree.dim:
        return 0.0
    m = int(math.log2(M + 1))
    r = M - (2**m - 1)
    return tree.alpha**m * (1 - r / 2**m) + sum(tree.alpha**k for k in range(m + 1, tree.depth))


def test_noisefree_right_and_wrong():
    assert check_noisefree_loss(adaptive_right)
    assert check_noisefree_loss(nonadaptive_right, "nonadaptive")
    off = check_noisefree_loss(lambda tree, L: sum(tree.alpha**k for k in range(L + 1, tree.depth)))
    assert failed_with(off, "off_by_one_up", "off by one")
    no_partial = check_noisefree_loss(lambda tree, M: adaptive_right(tree, int(math.log2(M + 1))), "nonadaptive")
    assert failed_with(no_partial, "no_partial_level", "partial level")
    swapped = check_noisefree_loss(nonadaptive_right, "adaptive")
    assert failed_with(swapped, "other_formula", "swap")
    with pytest.raises(ValueError, match="kind"):
        check_noisefree_loss(adaptive_right, "greedy")
