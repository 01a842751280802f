"""Held-out evaluation: accuracy (fraction of responses whose answer is fully correct) and mean reward.

Two views per evaluation: ``greedy`` (one greedy response per prompt) and ``sampled`` (``samples``
responses per prompt with the rollout sampling parameters, the distribution RL trains).

Responses are graded as a training step's are (``rewards/grading.py``): by a :class:`StepGrader` under one
deadline per view (``grading.deadline_s``; a view's responses are graded together), so a reward function that never returns cannot
hang a run; a response not graded in time scores its task's failure reward, counts as wrong and is counted in
``eval/{view}_grader_late``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adora_openrlhf.config import SamplingParams
from adora_openrlhf.engine.rollout import GenerationSettings
from adora_openrlhf.rewards.base import failure_reward
from adora_openrlhf.rewards.grading import GradingJob, StepGrader
from adora_openrlhf.tasks.behaviours import style_fractions
from adora_openrlhf.tasks.behaviours import subset_labels as source_subsets


def evaluate(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[Any],
    reward_fns: Sequence[Any],
    params: SamplingParams,
    samples: int,
    settings: GenerationSettings,
    extras: Sequence[Any] | None = None,
    grader: StepGrader | None = None,
) -> dict[str, float]:
    """Metrics ``eval/greedy_accuracy``, ``eval/greedy_reward``, ``eval/greedy_format``,
    ``eval/greedy_length_mean``, the behaviour shares of the task's probe (``eval/greedy_thorough_fraction``
    for K&K), the accuracy on each subset that holds some but not all rows (``eval/greedy_accuracy/ppl_3``: the
    subsets of ``tasks.behaviours.SUBSET_RULES``, K&K by number of people) and the same for ``sampled`` when ``samples > 0``.
    ``extras`` holds each row's extra model inputs (images), or is None for text rows. ``grader`` grades under
    the run's deadline (a new :class:`StepGrader` with the default ``grading`` section when None); each view gets the
    whole budget (a view spent on a stuck reward does not score the next view's fast grades late), and
    ``eval/{view}_grader_late`` counts each view's responses scored late."""
    views = [("greedy", 1, True)] + ([("sampled", samples, False)] if samples > 0 else [])
    labels = subset_labels(rows)
    metrics: dict[str, float] = {}
    grader = grader or StepGrader()
    for name, k, greedy in views:
        index = [i for i in range(len(rows)) for _ in range(k)]
        outputs = settings.generate(
            model,
            tokenizer,
            [prompt_ids[i] for i in index],
            params,
            greedy=greedy,
            extras=[extras[i] for i in index] if extras is not None else None,
        )
        correct = rewards = well_formed = length = 0.0
        texts = [tokenizer.decode(response, skip_special_tokens=True) for response, _ in outputs]
        grader.start_step()
        results = grade_responses(grader, [(reward_fns[i], rows[i]) for i in index], texts)
        by_subset: dict[str, list[float]] = {}
        for i, (response, _), result in zip(index, outputs, results, strict=True):
            for label in labels[i]:
                by_subset.setdefault(label, []).append(float(result.correct))
            correct += float(result.correct)
            rewards += result.reward
            well_formed += float(result.info.get("format_ok", 0.0))
            length += len(response)
        n = max(len(index), 1)
        metrics[f"eval/{name}_accuracy"] = correct / n
        metrics[f"eval/{name}_reward"] = rewards / n
        metrics[f"eval/{name}_format"] = well_formed / n
        metrics[f"eval/{name}_length_mean"] = length / n
        metrics[f"eval/{name}_grader_late"] = float(grader.late)
        metrics.update(style_fractions([rows[i].source for i in index], texts, f"eval/{name}_"))
        for label, values in sorted(by_subset.items()):
            if len(values) < len(index):  # a subset that holds every row repeats the overall accuracy
                metrics[f"eval/{name}_accuracy/{label.replace('=', '_')}"] = sum(values) / len(values)
    return metrics


def grade_responses(grader: StepGrader, graded_by: Sequence[tuple[Any, Any]], texts: Sequence[str]) -> list[Any]:
    """The reward results of ``texts`` (each graded by its ``(reward_fn, row)``) under ``grader``'s deadline; a
    response not graded in time gets :func:`rewards.grading.late_result` with its row's task failure reward."""
    jobs = [
        GradingJob(reward_fn, text, row.label, row.meta, failure_reward(row.source, row.meta))
        for (reward_fn, row), text in zip(graded_by, texts, strict=True)
    ]
    return grader.grade(jobs)


def majority_accuracy(train_rows: Sequence[Any], eval_rows: Sequence[Any]) -> float:
    """The held-out accuracy of a policy that ignores the input: each held-out row answered with the most frequent
    training label among the training rows of its subsets (the same tuple of ``tasks.behaviours.SUBSET_RULES`` labels, e.g.
    question kind and level; all training rows when none share it), right when it equals the row's label (labels
    compared stripped; ties go to the label seen first). The baseline a policy must beat to be reading its inputs."""
    from collections import Counter

    by_subsets: dict[tuple[str, ...], Counter] = {}
    for row, labels in zip(train_rows, subset_labels(train_rows), strict=True):
        by_subsets.setdefault(tuple(labels), Counter())[str(row.label).strip()] += 1
    overall = Counter(str(row.label).strip() for row in train_rows)
    if not eval_rows or not overall:
        return 0.0
    right = 0
    for row, labels in zip(eval_rows, subset_labels(eval_rows), strict=True):
        answer = (by_subsets.get(tuple(labels)) or overall).most_common(1)[0][0]
        right += answer == str(row.label).strip()
    return right / len(eval_rows)


def subset_labels(rows: Sequence[Any]) -> list[list[str]]:
    """Each row's subset labels by its source (``tasks.behaviours.SUBSET_RULES``, as the evaluation benchmarks name them:
    K&K ``ppl=N`` and ``ID``/``OOD``, MATH500 ``level=L`` ...); none for sources without a benchmark."""
    return [source_subsets({"source": row.source, "meta": row.meta}) for row in rows]
