"""Training speed of models A, B, C at the reference configuration (chapter 6, *Tree prior*).

Not a test: run it by hand and read the numbers.

    python benchmarks/bench_train.py            # step/sampling ratios, A's time to 0.05
    python benchmarks/bench_train.py --full     # also 3000-step final losses, tree and twin

Reference configuration: tree K=6 (D=63), alpha=0.5, N=128, sigma=0, M=6, width 128,
batch 256, Adam 3e-3 with cosine schedule. Targets on 2 CPU cores: a training step
(forward + backward + Adam) costs at most 3x sampling that step's contexts, and model A
reaches excess loss 0.05 within 60 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from fvlib.task import make_generator, sample_task
from fvlib.training import TrainConfig, build_model, build_prior, lr_at, sample_queries, train, training_step

REFERENCE = TrainConfig(
    model="A",
    prior="tree",
    depth=6,
    alpha=0.5,
    n_ctx=128,
    noise_std=0.0,
    budget=6,
    steps=3000,
    batch=256,
    lr=3e-3,
    width=128,
    device="cpu",
)


def step_over_sampling(config: TrainConfig, repeats: int = 30, warmup: int = 5) -> tuple[float, float]:
    """Median milliseconds of ``sample_task`` and of the rest of a training step, interleaved.

    The step time includes drawing the extra query tokens, so the ratio is conservative.
    """
    prior, model = build_prior(config), build_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    generator = make_generator(config.seed)
    sample_ms, step_ms = [], []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        batch = sample_task(prior, config.batch, config.n_ctx, config.noise_std, generator)
        t1 = time.perf_counter()
        x_query, y_query = sample_queries(batch, config.queries, generator)
        training_step(model, optimizer, batch, x_query, y_query, lr_at(i, config))
        t2 = time.perf_counter()
        if i >= warmup:
            sample_ms.append(1e3 * (t1 - t0))
            step_ms.append(1e3 * (t2 - t1))
    return statistics.median(sample_ms), statistics.median(step_ms)


def seconds_to_reach(config: TrainConfig, target: float) -> tuple[float, float, int] | None:
    """Wall seconds and CPU seconds of this process (evaluations every 50 steps included) and
    the step at which the evaluated excess loss first drops to ``target``; ``None`` if never.

    On a machine shared with other jobs the wall time overstates the cost; CPU seconds
    divided by the thread count is the wall time the run would take on idle cores.
    """
    probe = dataclasses.replace(config, eval_every=50, eval_contexts=1000)
    cpu_start = time.process_time()
    result = train(probe, progress=False, callback=lambda entry: entry["eval_excess_loss"] <= target)
    cpu_seconds = time.process_time() - cpu_start
    last = result.history[-1]
    if last["eval_excess_loss"] > target:
        return None
    return last["seconds"], cpu_seconds, last["step"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2, as in CI)")
    parser.add_argument(
        "--full", action="store_true", help="also train A, B, C for 3000 steps on tree and twin"
    )
    parser.add_argument("--target", type=float, default=0.05, help="excess loss model A must reach")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    print("\nstep time / sampling time (batch 256, N=128, D=63, 64 query tokens):")
    for kind in "ABC":
        sample_ms, step_ms = step_over_sampling(dataclasses.replace(REFERENCE, model=kind))
        ratio = step_ms / sample_ms
        print(f"  model {kind}: sample_task {sample_ms:6.1f} ms  step {step_ms:6.1f} ms  ratio {ratio:4.2f}")

    reached = seconds_to_reach(REFERENCE, args.target)
    if reached is None:
        print(f"\nmodel A never reached excess loss {args.target} in {REFERENCE.steps} steps")
    else:
        wall, cpu, step = reached
        print(f"\nmodel A reaches excess loss {args.target} at step {step}: {wall:.1f} s wall, {cpu:.1f} s CPU")

    if args.full:
        print("\nfinal excess loss after 3000 steps (4000 evaluation contexts):")
        for prior in ("tree", "gaussian-twin"):
            for kind in "ABC":
                config = dataclasses.replace(
                    REFERENCE, model=kind, prior=prior, eval_contexts=4000, eval_every=3000
                )
                result = train(config, progress=False)
                print(f"  {prior:14s} model {kind}: {result.final_loss:.4f}  ({result.seconds:.0f} s)")


if __name__ == "__main__":
    main()
