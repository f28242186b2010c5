"""The verdict table of a controls experiment (``controls-k6``, ``long-context-k6``,
``controls-k8``), as markdown: per curve (variant and prior) the mean loss per budget, its ratio
to model B and to greedy at the largest budget with standard errors, the exponential and
power-law fits with their R^2 (:func:`fvlib.experiments.decay_fits`), the local drop factors
``L(M) / L(M + 1)``, the seeds converged and failed, and the CPU hours spent. Computes nothing
but summaries of the stored file (partial files too: only budgets stored for every seed).

    python scripts/controls_report.py controls-k6
"""

from __future__ import annotations

import sys

from fvlib.experiments import controls_rows, decay_fits, load_result, provenance_summary


def _fmt(pair) -> str:
    return f"{pair[0]:.3f} ± {pair[1]:.3f}" if pair else ""


def report(name: str) -> str:
    data = load_result(name)
    rows = controls_rows(data)
    lines = [f"## {name}", "", provenance_line(data), "",
             "| curve | budgets | mean loss per budget | / B at M max | / greedy at M max | fit exp (factor, R²) "
             "| fit power (exponent, R²) | drop factors | converged | failed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    curves = sorted({(r["variant"], r["prior"]) for r in rows}, key=lambda c: (c[1] != "tree", c[0]))
    for variant, prior in curves:
        points = sorted((r for r in rows if (r["variant"], r["prior"]) == (variant, prior)),
                        key=lambda r: r["budget"])
        last = points[-1]
        fits = [f for f in decay_fits(data, [variant], prior=prior) if f["seed"] == "mean"] if len(points) > 2 else []
        fit = fits[0] if fits else None
        lines.append("| " + " | ".join([
            f"{variant} ({prior})", f"{points[0]['budget']}..{last['budget']}",
            " ".join(f"{r['mean']:.4f}" for r in points),
            _fmt(last.get("ratio_to_B")), _fmt(last.get("ratio_to/adaptive_greedy")),
            f"{fit['factor']:.2f}, {fit['fit'].exp_r2:.3f}" if fit else "",
            f"{fit['fit'].power_exponent:.2f}, {fit['fit'].power_r2:.3f}" if fit else "",
            " ".join(f"{d:.2f}" for d in fit["drops"]) if fit else "",
            f"{sum(r['converged'] for r in points)} of {sum(len(r['seeds']) for r in points)}",
            f"{sum(r['failed'] for r in points)}"]) + " |")
    return "\n".join(lines)


def provenance_line(data: dict) -> str:
    summary = provenance_summary(data)
    return (f"{summary['runs']} runs stored, {summary['cpu_seconds'] / 3600:.2f} CPU hours "
            f"({summary['wall_seconds'] / 3600:.2f} wall hours)")


if __name__ == "__main__":
    for name in sys.argv[1:] or ["controls-k6"]:
        print(report(name))
        print()
