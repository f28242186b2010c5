"""fvlib.course.gaussian: the Gaussian posterior (mean and covariance), right and wrong."""

import math

import pytest
import torch
from course_results import failed_with

from fvlib.course import check_gaussian_posterior

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def gauss_right(cov, W, phi, tau2):
    S = W @ cov @ W.T + tau2 * torch.eye(W.shape[0], dtype=torch.float64)
    gain = torch.linalg.solve(S, W @ cov).T
    return phi @ gain.T, cov - gain @ W @ cov


def test_gaussian_posterior_right_and_wrong():
    assert check_gaussian_posterior(gauss_right)

    def no_prior(cov, W, phi, tau2):
        return phi @ torch.linalg.pinv(W).T, gauss_right(cov, W, phi, tau2)[1]

    assert failed_with(check_gaussian_posterior(no_prior), "no_prior", "least squares", "posterior mean")
    tau = check_gaussian_posterior(lambda c, W, p, t2: gauss_right(c, W, p, math.sqrt(t2)))
    assert failed_with(tau, "tau_not_tau2", "tau2")
    prior_cov = check_gaussian_posterior(lambda c, W, p, t2: (gauss_right(c, W, p, t2)[0], c))
    assert failed_with(prior_cov, "prior_cov", "posterior covariance")
    assert failed_with(check_gaussian_posterior(lambda c, W, p, t2: gauss_right(c, W, p, t2)[0]), None, "pair")
