"""Benchmark of the theory core (prints figures; not a test).

    python benchmarks/bench_theory.py

Prints the exact tree-posterior throughput (greedy adaptive policy with budget K, exact
enumeration over the 2^K leaves, finite-N statistics) in contexts per second for K = 10 and
K = 12, the time of the K = 3 dynamic program (L = 2 and L = 3, tau = 0.3 and 0.6), with and
without re-measuring, and the cost of the optimised adaptive policy (``adaptive_opt``: the
optimised fixed directions it starts from, then its own training) at K = 4, 5, 6 with M = K,
N = 128. ``--quick`` leaves out the three-layer DP and the K = 6 policy.
"""

import sys
import time

import torch

from fvlib import TreePrior
from fvlib.theory import (
    FiniteSampleChannel,
    channel_tau2,
    dp_no_repeat,
    dp_value,
    greedy_value,
    mc_contexts,
    optimise_adaptive_policy,
    optimise_directions,
    run_greedy,
)


def posterior_throughput(depth: int, contexts: int, repeats: int = 3) -> float:
    tree = TreePrior(depth, 0.5)
    tau2 = channel_tau2(tree, 128, 0.0)
    _, _, g_hat = mc_contexts(tree, contexts, 128, 0.0, seed=0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run_greedy(tree, FiniteSampleChannel(g_hat), depth, tau2)
        best = min(best, time.perf_counter() - start)
    return contexts / best


def adaptive_opt_cost(depth: int) -> tuple[float, float, str]:
    """Seconds for the optimised directions and for the adaptive policy, and the kept candidate."""
    tree = TreePrior(depth, 0.5)
    tau2 = channel_tau2(tree, 128, 0.0)
    start = time.perf_counter()
    directions = optimise_directions(tree, depth, tau2, seed=0)
    rows_s = time.perf_counter() - start
    policy = optimise_adaptive_policy(tree, depth, tau2, directions=directions, seed=0)
    return rows_s, policy.seconds, policy.kind


def main():
    quick = "--quick" in sys.argv
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for depth, contexts in ((10, 2000), (12, 500)):
        throughput = posterior_throughput(depth, contexts)
        print(f"exact tree posterior, K={depth}, budget {depth}: {throughput:,.0f} contexts/s")
    tree = TreePrior(3, 0.5)
    for layers in (2,) if quick else (2, 3):
        for tau in (0.3, 0.6):
            start = time.perf_counter()
            dp = dp_value(tree, layers, tau)
            elapsed = time.perf_counter() - start
            start = time.perf_counter()
            no_repeat = dp_no_repeat(tree, layers, tau)
            elapsed_nr = time.perf_counter() - start
            greedy = greedy_value(tree, layers, tau)
            print(f"DP K=3 L={layers} tau={tau}: {elapsed:.2f} s "
                  f"(DP {dp:.4f}, greedy {greedy:.4f}, 48 Gauss-Hermite points); "
                  f"no repeat {elapsed_nr:.2f} s ({no_repeat:.4f})")
    for depth in (4, 5) if quick else (4, 5, 6):
        rows_s, policy_s, kind = adaptive_opt_cost(depth)
        print(f"adaptive_opt K={depth} M={depth} N=128: "
              f"directions {rows_s:.1f} s + policy {policy_s:.1f} s (kept: {kind})")


if __name__ == "__main__":
    main()
