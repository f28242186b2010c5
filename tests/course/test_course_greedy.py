"""fvlib.course.greedy: the greedy action, right and wrong."""

import pytest
import torch
from course_results import failed_with

from fvlib.course import check_greedy_action

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def greedy_right(tree, log_w, step):
    probs = torch.softmax(log_w, -1)
    return probs.reshape(probs.shape[0], 2**step, -1).sum(-1).argmax(-1) + 2**step - 1


def test_greedy_action_right_and_wrong():
    assert check_greedy_action(greedy_right)
    no_offset = check_greedy_action(lambda tree, lw, step: greedy_right(tree, lw, step) - (2**step - 1))
    assert failed_with(no_offset, "no_offset", "node ids")

    def leaf_path(tree, log_w, step):
        return tree.path_nodes(tree.all_signs[log_w.argmax(-1)])[:, step]

    assert failed_with(check_greedy_action(leaf_path), "leaf_path", "most probable leaf", "total")
    next_level = check_greedy_action(lambda tree, lw, step: greedy_right(tree, lw, min(step + 1, tree.depth - 1)))
    assert failed_with(next_level, "next_level", "0-based")
