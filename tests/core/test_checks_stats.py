"""fvlib._checks (argument checks at the entry points) and fvlib.stats (squared error, mean and
standard error, the mean over seeds)."""

import math

import numpy as np
import pytest
import torch

from fvlib._checks import check_int, check_number, is_int
from fvlib.stats import mean_and_stderr, seed_mean, squared_error


def test_check_int_accepts_integers_in_range():
    assert check_int("n", 3, 1) == 3 and check_int("n", 0) == 0 and check_int("n", 5, 1, 5) == 5
    assert is_int(3) and not is_int(True) and not is_int(3.0)


@pytest.mark.parametrize(
    "value, low, high, message",
    [
        (True, 1, None, "n must be a positive integer, got True"),
        (2.0, None, None, "n must be an integer, got 2.0"),
        (-1, 0, None, "n must be a non-negative integer, got -1"),
        (7, 1, 6, r"n must be an integer in \[1, 6\], got 7"),
        (1, 2, None, "n must be an integer >= 2, got 1"),
    ],
)
def test_check_int_names_the_bad_value(value, low, high, message):
    with pytest.raises(ValueError, match=message):
        check_int("n", value, low, high)


def test_check_number():
    assert check_number("x", 0.5, 0, 1) == 0.5 and check_number("x", 2, 0, low_open=True) == 2
    for value, kwargs, message in [
        (0.0, {"low": 0, "low_open": True}, "x must be a positive number, got 0.0"),
        (-0.1, {"low": 0}, "x must be a non-negative number, got -0.1"),
        (1.5, {"low": 0, "high": 1, "low_open": True}, r"x must be a number in \(0, 1\], got 1.5"),
        (math.nan, {}, "x must be a finite number, got nan"),
        (math.inf, {"low": 0}, "got inf"),
        (False, {}, "got False"),
        ("1", {}, "got '1'"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_number("x", value, **kwargs)


def test_squared_error_and_mean_and_stderr():
    theta = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    assert squared_error(theta, torch.zeros_like(theta)).tolist() == [5.0, 0.0]
    values = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    mean, stderr = mean_and_stderr(values)
    assert mean.tolist() == [3.0] and stderr.item() == pytest.approx(values.std().item() / 2)
    mean, stderr = mean_and_stderr(torch.tensor([4.0]))
    assert mean.item() == 4.0 and math.isnan(stderr.item())


def test_seed_budget_instance_and_tensor_checks():
    from fvlib._checks import MAX_SEED, check_budget, check_instance, check_seed, check_tensor

    assert check_seed("seed", 0) == 0 and check_seed("seed", MAX_SEED) == MAX_SEED
    for bad in (-1, MAX_SEED + 1, 10**23, 1.0, True):
        with pytest.raises(ValueError, match=rf"seed must be an integer in \[0, {MAX_SEED}\], got"):
            check_seed("seed", bad)
    assert check_budget("budget", 7, 3) == 7
    for bad in (0, 8, 2.0):
        message = rf"budget must be an integer in \[1, 7\] \(D = 2\^K - 1 at depth 3\), got {bad}"
        with pytest.raises(ValueError, match=message):
            check_budget("budget", bad, 3)
    with pytest.raises(ValueError, match="tree must be a dict or list, got str"):
        check_instance("tree", "x", (dict, list))
    t = torch.zeros(2, 8)
    assert check_tensor("probs", t, (None, 8)) is t
    for value, kwargs, message in [
        ([[0.0] * 8], {}, r"probs must be a torch.Tensor of shape \(B, 2\^K\) = \(\*, 8\), got list"),
        (torch.zeros(2, 7), {}, r"probs must have shape \(B, 2\^K\) = \(\*, 8\), got \(2, 7\)"),
        (torch.zeros(8), {}, r"got \(8,\)"),
        (torch.zeros(2, 8, dtype=torch.complex64), {}, "probs must be a real tensor, got dtype torch.complex64"),
        (torch.zeros(2, 8, dtype=torch.bool), {}, "real tensor"),
        (torch.zeros(2, 8), {"integer": True}, "probs must be an integer tensor, got dtype torch.float32"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_tensor("probs", value, (None, 8), "(B, 2^K)", **kwargs)


def test_check_number_takes_numpy_and_zero_dim_tensors_but_not_bools():
    import numpy as np

    assert check_number("x", np.float32(0.5), 0, 1) == np.float32(0.5)
    assert float(check_number("x", torch.tensor(0.5), 0, 1)) == 0.5
    for bad in (np.bool_(True), torch.tensor(True), torch.tensor([0.5]), torch.tensor(1j)):
        with pytest.raises(ValueError, match="x must be"):
            check_number("x", bad)


def test_seed_mean_is_the_mean_its_stderr_and_the_spread_over_seeds():
    losses, stderrs = np.array([[1.0, 2.0], [3.0, 6.0], [2.0, 4.0]]), np.array([[0.1, 0.2], [0.2, 0.2], [0.2, 0.1]])
    mean, stderr, spread = seed_mean(losses, stderrs)
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(stderr, [0.3 / 3, 0.3 / 3])
    np.testing.assert_allclose(spread, [1.0, 2.0])
    one = seed_mean(losses[:1], stderrs[:1])
    assert one[0].tolist() == [1.0, 2.0] and one[1].tolist() == [0.1, 0.2] and one[2].tolist() == [0.0, 0.0]
    assert [float(v) for v in seed_mean([1.0, 3.0], [0.3, 0.4])] == [2.0, 0.25, float(np.std([1.0, 3.0], ddof=1))]
    with pytest.raises(ValueError, match="shape"):
        seed_mean(losses, stderrs[:2])
    with pytest.raises(ValueError, match="shape"):
        seed_mean([], [])
