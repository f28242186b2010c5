"""Fixtures and helpers shared by several test modules (``from conftest import ...`` for the
helpers: pytest puts this directory on ``sys.path``)."""

import subprocess
import sys

import pytest
import torch

from fvlib import TreePrior, make_generator, sample_task
from fvlib.models import model_a
from fvlib.training import TrainConfig
from fvlib.transformer import make_transformer

#: A tiny but real training run: tree K = 3 (D = 7), N = 32, budget 3, 40 steps, with a short
#: imitation warm start, evaluations every 10 steps and checkpoints every 15.
TINY = TrainConfig(model="A", depth=3, n_ctx=32, budget=3, steps=40, batch=32, queries=8, width=16,
                   router_warm_start=20, eval_every=10, eval_contexts=64, checkpoint_every=15, device="cpu")


def run_cli(*args) -> subprocess.CompletedProcess:
    """``python -m fvlib ARGS`` in a fresh process: its exit status, stdout and stderr (text)."""
    # the limit only catches a hang: far above the slowest call here (reproduce --quick, about
    # 20 s on a loaded 2-core machine)
    return subprocess.run([sys.executable, "-m", "fvlib", *args], check=False, capture_output=True, text=True,
                          timeout=900)


def strip_times(history: list[dict]) -> list[dict]:
    """A training history without its wall times (the rest is deterministic)."""
    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in history]


def seeded_transformer(prior, kind: str = "A", arrangement: str = "bottlenecked", budget: int = 3, seed: int = 0,
                       **kwargs):
    """A random standard transformer (``d_model`` 16, head size 8) for ``prior`` in which every
    weight matters: each parameter is moved off its initialisation (no zero starts, so the
    read-out and the checks on it are not vacuous); in eval mode."""
    torch.manual_seed(seed)
    model = make_transformer(kind, prior, budget, arrangement, d_model=16, head_dim=8, **kwargs)
    for p in model.parameters():
        p.data.add_(0.3 * torch.randn_like(p))
    return model.eval()


def untrained_model_a(budget: int = 3, contexts: int = 300, seed: int = 0):
    """``(tree, model, batch)``: an untrained model A (gated router, width 16) for a tree
    ``K = 3``, ``alpha = 0.5``, and ``contexts`` contexts of it (``N = 64``, ``sigma = 0.1``)."""
    torch.manual_seed(seed)
    tree = TreePrior(3, 0.5)
    model = model_a(tree, budget, width=16)
    batch = sample_task(tree, contexts, 64, 0.1, make_generator(seed))
    return tree, model, batch


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two models hold bitwise the same parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def one_thread():
    """These tensors are tiny: one thread is as fast as two and immune to busy neighbours.

    Use it module-wide with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
