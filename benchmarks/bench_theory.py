"""Benchmark of the theory core (prints figures; not a test).

    python benchmarks/bench_theory.py

Prints the exact tree-posterior throughput (greedy adaptive policy with budget K, exact
enumeration over the 2^K leaves, finite-N statistics) in contexts per second for K = 10 and
K = 12, and the time of the K = 3 dynamic program (L = 2 and L = 3, tau = 0.3 and 0.6).
"""

import time

import torch

from fvlib import TreePrior
from fvlib.theory import channel_tau2, dp_value, greedy_value, mc_contexts, run_greedy, FiniteSampleChannel


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


def main():
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for depth, contexts in ((10, 2000), (12, 500)):
        print(f"exact tree posterior, K={depth}, budget {depth}: {posterior_throughput(depth, contexts):,.0f} contexts/s")
    tree = TreePrior(3, 0.5)
    for layers in (2, 3):
        for tau in (0.3, 0.6):
            start = time.perf_counter()
            dp = dp_value(tree, layers, tau)
            elapsed = time.perf_counter() - start
            greedy = greedy_value(tree, layers, tau)
            print(f"DP K=3 L={layers} tau={tau}: {elapsed:.2f} s (DP {dp:.4f}, greedy {greedy:.4f}, 48 Gauss-Hermite points)")


if __name__ == "__main__":
    main()
