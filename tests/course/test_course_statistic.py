"""fvlib.course.statistic: the pooled statistic g_hat, right and wrong."""

import pytest
import torch
from course_results import failed_with

from fvlib.course import check_sufficient_statistic

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def ghat_right(x, y):
    return torch.einsum("bn,bnd->bd", y, x) / x.shape[1]


def test_sufficient_statistic_right_and_wrong():
    assert check_sufficient_statistic(ghat_right)
    result = check_sufficient_statistic(lambda x, y: torch.einsum("bn,bnd->bd", y, x))
    assert failed_with(result, "sum", "context", "coordinate", "divide")
