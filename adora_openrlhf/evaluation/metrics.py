"""Evaluation metrics over per-sample records: avg@k and unbiased pass@k, per benchmark and subset.

For a problem with n sampled responses of which c are correct:

- avg@n = c / n (the mean accuracy of the samples; an estimate of pass@1);
- pass@k = 1 - C(n - c, k) / C(n, k), the unbiased estimator of Chen et al. (2021), computed as
  1 - prod_{i = n - c + 1}^{n} (1 - k / i) to stay exact for large n; 1 when n - c < k.

A benchmark's score is the mean over its problems.

Sampling noise of avg@k on a fixed set of n problems: problem i's samples are k Bernoulli draws with its own
success rate p_i, so Var(avg@k) = sum_i p_i (1 - p_i) / k / n^2. With c_i correct of k the unbiased estimate of
p_i (1 - p_i) is c_i (k - c_i) / (k (k - 1)), so

    se = sqrt(sum_i c_i (k - c_i) / (k^2 (k - 1))) / n      (k >= 2; unknown for k = 1)

and avg@k ± 1.96 se is its 95% interval. It is the noise of resampling the responses, not of drawing other
problems: the interval within which another seed's avg@k on the same problems falls, not a population interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c of them correct."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and n >= 1, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in 1..n={n}, got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class ScoreRow:
    benchmark: str
    subset: str  # "all" for the whole benchmark
    problems: int
    samples: int
    avg_at_k: float
    pass_at: Mapping[int, float]  # k -> pass@k
    sampling_se: float | None = (
        None  # standard error of avg_at_k from resampling responses (module docstring); None for k = 1
    )


def sampling_se(counts: Sequence[tuple[int, int]]) -> float | None:
    """The standard error of avg@k over problems with (k samples, c correct) each (module docstring); None when a
    problem has fewer than 2 samples."""
    if not counts or any(n < 2 for n, _ in counts):
        return None
    variance = sum(c * (n - c) / (n * n * (n - 1)) for n, c in counts)
    return math.sqrt(variance) / len(counts)


def ks_for(n: int) -> list[int]:
    """Powers of two up to n, plus n itself: the pass@k columns reported for n samples."""
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= n]
    return ks if n in ks else ks + [n]


def score_records(records: Iterable[Mapping], k: int) -> list[ScoreRow]:
    """Aggregate per-sample records (keys benchmark, problem_id, subsets, sample_index, correct) into rows.

    Only problems with all k samples present are scored (a partial run reports what it has finished).
    """
    per_problem: dict[tuple[str, str], dict] = {}
    for rec in records:
        key = (rec["benchmark"], str(rec["problem_id"]))
        entry = per_problem.setdefault(key, {"subsets": list(rec.get("subsets", [])), "correct": {}})
        entry["correct"][int(rec["sample_index"])] = bool(rec["correct"])
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for (bench, _), entry in per_problem.items():
        samples = [entry["correct"][i] for i in sorted(entry["correct"]) if i < k]
        if len(samples) < k:
            continue
        counts = (len(samples), sum(samples))
        groups[(bench, "all")].append(counts)
        for subset in entry["subsets"]:
            groups[(bench, subset)].append(counts)
    rows = []
    for (bench, subset), counts in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", _subset_order(kv[0][1]))
    ):
        rows.append(
            ScoreRow(
                benchmark=bench,
                subset=subset,
                problems=len(counts),
                samples=sum(n for n, _ in counts),
                avg_at_k=sum(c / n for n, c in counts) / len(counts),
                pass_at={kk: sum(pass_at_k(n, c, kk) for n, c in counts) / len(counts) for kk in ks_for(k)},
                sampling_se=sampling_se(counts),
            )
        )
    return rows


def _subset_order(subset: str) -> tuple:
    digits = "".join(ch for ch in subset if ch.isdigit())
    return (int(digits) if digits else 10**6, subset)


def noise_text(row: ScoreRow, greedy: bool = False) -> str:
    """The 95% sampling-noise half-width of ``row``'s avg@k in percent: ``0 (greedy)``, ``n/a`` (k = 1) or ``± x``."""
    if greedy:
        return "0 (greedy)"
    return "n/a (k=1)" if row.sampling_se is None else f"± {100 * 1.96 * row.sampling_se:.1f}"


def markdown_table(rows: Sequence[ScoreRow], k: int, greedy: bool = False) -> str:
    """Markdown table with avg@k, its 95% sampling noise (:func:`noise_text`) and pass@k columns (percent)."""
    ks = ks_for(k)
    header = ["benchmark", "subset", "problems", f"avg@{k}", "noise (95%)"] + [f"pass@{kk}" for kk in ks]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.benchmark, row.subset, str(row.problems), f"{100 * row.avg_at_k:.1f}", noise_text(row, greedy)]
        cells += [f"{100 * row.pass_at[kk]:.1f}" for kk in ks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
