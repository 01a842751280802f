"""The tables of ``python -m bench.cluster_testbed`` (``table.md``): the main runs per backend and variant, the
replicates from one warm start, and the synchronous and asynchronous modes side by side."""

from __future__ import annotations

from typing import Any

from bench.common import (
    gain_cells,
    markdown_table,
)


def table(records: list[dict[str, Any]]) -> str:
    """One row per (backend, variant): accuracy at step 0 and at the end, gain, per seed and as mean ± 95% interval;
    then, when there are replicates, :func:`replicate_table`."""
    main_runs = [r for r in records if r.get("rl_seed") is None]
    parts = (main_table(main_runs) if main_runs else "", replicate_table(records), mode_table(records))
    return "\n\n".join(part for part in parts if part)


def correction_note(record: dict[str, Any]) -> str | None:
    """``IS token`` (or ``seq``) for a run with OpenRLHF's IS correction, else None."""
    return f"IS {record['is_correction']}" if record.get("is_correction") else None


def mode_label(record: dict[str, Any]) -> str:
    """``synchronous`` or ``asynchronous``, with :func:`correction_note` when the run had the IS correction."""
    mode = "asynchronous" if record.get("mode") == "async" else "synchronous"
    return ", ".join(note for note in (mode, correction_note(record)) if note)


def mode_table(records: list[dict[str, Any]]) -> str:
    """Per variant and seed run asynchronously on the openrlhf backend (main runs on kk-testbed), every mode's run
    side by side: held-out accuracy at each evaluation, the :func:`step_profile` medians, wall time, mean staleness
    and the largest gradient norm. Empty when no run was asynchronous."""
    runs = [r for r in records if r["backend"] == "openrlhf" and not r.get("regime") and r.get("rl_seed") is None]
    pairs = sorted({(r["variant"], r["seed"]) for r in runs if r.get("mode") == "async"})

    def cell(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = []
    for variant, seed in pairs:
        mine = [r for r in runs if (r["variant"], r["seed"]) == (variant, seed)]
        # synchronous before asynchronous, each uncorrected before corrected
        for r in sorted(mine, key=lambda r: (r.get("mode") == "async", r.get("is_correction") or "")):
            rows.append(
                [
                    variant,
                    str(seed),
                    mode_label(r),
                    ", ".join(f"{acc:.3f}" for _, acc in r["curve"]),
                    cell(r.get("step_s_median"), ".1f"),
                    cell(r.get("generation_s"), ".1f"),
                    cell(r.get("update_s"), ".1f"),
                    f"{r['wall_s']:.0f}",
                    cell(r.get("staleness_mean", 0.0), ".2f"),
                    cell(r.get("grad_norm_max"), ".2f"),
                ]
            )
    if not rows:
        return ""
    header = ["variant", "seed", "mode", "held-out accuracy at each evaluation", "s / step (median)"]
    header += ["generation s", "update s", "wall s", "staleness (mean)", "largest grad norm"]
    intro = "Synchronous against asynchronous (openrlhf), per seed; step times are medians over the steps.\n\n"
    return intro + markdown_table(header, rows)


def replicate_table(records: list[dict[str, Any]]) -> str:
    """Per (variant as :func:`variant_label` names it, warm-start seed) that has replicates, per backend: the final
    accuracy of each run seed (the main run's seed first), their mean, range and standard deviation; runs of another
    mode or IS correction are another variant. Empty without replicates."""
    import statistics

    wanted = dict.fromkeys((variant_label(r), r["seed"]) for r in records if r.get("rl_seed") is not None)
    rows = []
    for variant, seed in wanted:
        for backend in ("local", "openrlhf"):
            runs = [r for r in records if (r["backend"], variant_label(r), r["seed"]) == (backend, variant, seed)]
            runs.sort(key=lambda r: (r.get("rl_seed") is not None, r.get("rl_seed") or 0))
            if not runs:
                continue
            finals = [r["acc_final"] for r in runs]
            rows.append(
                [
                    backend,
                    variant,
                    str(seed),
                    " ".join(str(r.get("rl_seed", seed)) for r in runs),
                    " ".join(f"{a:.3f}" for a in finals),
                    f"{statistics.fmean(finals):.3f}",
                    f"{min(finals):.3f}-{max(finals):.3f}",
                    f"{statistics.stdev(finals):.3f}" if len(finals) > 1 else "-",
                ]
            )
    if not rows:
        return ""
    header = ["backend", "variant", "warm start", "run seeds", "acc final per run", "mean", "range", "sd"]
    return "Replicates: the same warm start and rows, other run seeds.\n\n" + markdown_table(header, rows)


def variant_label(record: dict[str, Any]) -> str:
    """The variant's name in the tables, with its regime when it is not kk-testbed's, ``async`` for a run of
    OpenRLHF's asynchronous loop and ``IS token`` (or ``seq``) for a run with OpenRLHF's IS correction."""
    async_note = "async" if record.get("mode") == "async" else None
    notes = [note for note in (record.get("regime"), async_note, correction_note(record)) if note]
    return record["variant"] + (f" ({', '.join(notes)})" if notes else "")


def main_table(records: list[dict[str, Any]]) -> str:
    """The rows of :func:`table` for the main runs (no ``rl_seed``)."""
    rows = []
    for backend in ("local", "openrlhf"):
        for variant in dict.fromkeys(variant_label(r) for r in records):
            runs = [r for r in records if r["backend"] == backend and variant_label(r) == variant]
            if not runs:
                continue
            rows.append(
                [
                    backend,
                    variant,
                    *gain_cells(runs),
                    f"{sum(r['step_s'] for r in runs if r['step_s']) / len(runs):.1f}",
                    f"{sum(r['responses'] for r in runs) / len(runs):.0f}",
                    f"{sum(r['wall_s'] for r in runs) / len(runs):.0f}",
                ]
            )
    header = [
        "backend",
        "variant",
        "seeds",
        "acc step 0",
        "acc final",
        "gain per seed",
        "gain (mean ± 95%)",
        "s / step",
        "responses",
        "wall s",
    ]
    return markdown_table(header, rows)
