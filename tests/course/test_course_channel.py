"""fvlib.course.channel: the channel noise tau^2, right and wrong."""

import math

import pytest
from course_results import failed_with

from fvlib.course import check_channel_tau2

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tau2_right(prior, n_ctx, noise_std):
    return (prior.energy + noise_std**2) / n_ctx


def test_tau2_right_and_wrong():
    assert check_channel_tau2(tau2_right)
    assert failed_with(check_channel_tau2(lambda p, n, s: (p.energy + s) / n), "sigma", "sigma^2")
    assert failed_with(check_channel_tau2(lambda p, n, s: p.energy / n), "no_sigma", "label noise")
    assert failed_with(check_channel_tau2(lambda p, n, s: math.sqrt(tau2_right(p, n, s))), "tau", "standard deviation")
    assert failed_with(check_channel_tau2(lambda p, n, s: (p.dim + s**2) / n), "dimension", "energy")
