"""The reward file for OpenRLHF's custom-reward hook (``--reward.remote_url /path/to/openrlhf_reward.py``).

OpenRLHF 0.11.2 loads this file with ``importlib`` and, after each rollout, calls
``reward_func(queries, prompts, labels)`` from a worker thread (``asyncio.to_thread``) where

* ``queries[i]`` is the decoded prompt + response (special tokens kept),
* ``prompts[i]`` is the chat-templated prompt string,
* ``labels[i]`` is the row's ``--data.label_key`` column.

It expects ``{"rewards": Tensor[N], "scores": Tensor[N], "extra_logs": {name: Tensor[N]}}``: ``rewards``
enter the advantage computation, ``scores`` (0/1 here: the task's correctness) drive dynamic filtering,
and every ``extra_logs`` entry becomes a per-sample ``Experience.info`` field, so the same keys are
returned for every row whatever its task.

Rows name their task through the label: the converters write a ``reward_label`` column holding
``{"source", "label", "meta"}`` as JSON (see :func:`encode_reward_label`), so the launcher passes
``--data.label_key reward_label``. A plain-text label also works when the environment variable
``ADORA_REWARD_SOURCE`` names the source for the whole run.

Loading the file imports the package and its task rewards (:func:`check_package`): on a node where
``adora_openrlhf`` cannot be imported, OpenRLHF's loader fails when the engines start, with the install hint,
instead of every rollout scoring 0. A row that fails to score (a bad label, a crash inside a reward
function) gets its task's failure reward (:func:`failure_reward_of_label`: the task's lowest reward, e.g. -1
for DAPO rows, -3 for K&K; 0 when the label names no task) and is counted in ``reward_error``; a grader
timeout scores as a wrong answer inside the reward functions themselves. Each call's rows are graded
concurrently under one deadline per call (``rewards/grading.py``; the run's ``grading`` section reaches the
worker through ``ADORA_GRADING_DEADLINE_S`` / ``ADORA_GRADING_WORKERS``); a row past it scores the failure
reward and is counted in ``grader_late``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the package on every node that runs vLLM engines (pip install -e <repo>), or submit the Ray job "
    "with --working-dir <repo> / py_modules so that the engine processes can import it"
)


def check_package() -> None:
    """Import the package and its task rewards now; raise ImportError with the install hint if that fails."""
    try:
        from adora_openrlhf.rewards import base

        base._load_builtin_rewards()
    except ImportError as err:
        raise ImportError(
            f"{__file__}: the reward file cannot import adora_openrlhf ({err}); every rollout would score 0. {INSTALL_HINT}"
        ) from err


check_package()  # at load time: OpenRLHF loads this file when its rollout engines start

REWARD_LABEL_KEY = "reward_label"  # the column the converters add, for --data.label_key
SOURCE_ENV = "ADORA_REWARD_SOURCE"
EXTRA_LOG_KEYS = ("correct", "answer_found", "grader_timeout", "grader_error", "grader_late", "reward_error")
ASSISTANT_MARKERS = (  # where the response starts when the prompt text cannot be matched exactly
    "<|im_start|>assistant\n",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<｜Assistant｜>",
    "Assistant:",
)


def encode_reward_label(source: str, label: str, meta: Mapping[str, Any] | None = None) -> str:
    """The JSON text carried in a row's ``reward_label`` column."""
    return json.dumps({"source": source, "label": label, "meta": dict(meta or {})}, ensure_ascii=False, sort_keys=True)


def with_reward_label(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a schema row with its ``reward_label`` column filled in."""
    out = dict(row)
    out[REWARD_LABEL_KEY] = encode_reward_label(row["source"], row["label"], row.get("meta"))
    return out


def decode_reward_label(label: Any) -> tuple[str, str, dict[str, Any]]:
    """``(source, label, meta)`` from a ``reward_label`` value (JSON text or dict) or a plain label.

    A plain label needs ``ADORA_REWARD_SOURCE``; otherwise a ValueError says how to fix the launch.
    """
    if isinstance(label, Mapping):
        payload: Any = label
    else:
        text = "" if label is None else str(label)
        payload = None
        if text.lstrip().startswith("{"):
            try:
                payload = json.loads(text)
            except json.JSONDecodeError:
                payload = None
    if isinstance(payload, Mapping) and "source" in payload and "label" in payload:
        meta = payload.get("meta") or {}
        return str(payload["source"]), str(payload["label"]), dict(meta) if isinstance(meta, Mapping) else {}
    source = os.environ.get(SOURCE_ENV)
    if not source:
        raise ValueError(
            f"label: {str(label)[:80]!r} does not name its source; pass --data.label_key {REWARD_LABEL_KEY} "
            f"(written by the data_prep converters) or set {SOURCE_ENV} to the task's source"
        )
    return source, "" if label is None else str(label), {}


# End-of-turn / end-of-sequence tokens that OpenRLHF's decoded query keeps (special tokens are not skipped)
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<｜end▁of▁sentence｜>")


def strip_end_markers(response: str) -> str:
    """``response`` without the end-of-turn / end-of-sequence tokens (and padding repeats of them) at its end,
    so that rules reading the end of the text (DAPO's ``Answer:`` line) see what the model wrote.

    Whitespace before a marker goes with it; whitespace with no marker before it stays. The end moves left
    over the text once (slicing a copy per marker took n^2 time on n repeats)."""
    end = len(response)
    while True:
        stripped = end
        while stripped > 0 and response[stripped - 1].isspace():
            stripped -= 1
        for marker in END_MARKERS:
            if response.endswith(marker, 0, stripped):
                end = stripped - len(marker)
                break
        else:
            return response[:end]


def split_response(query: str, prompt: str) -> str:
    """The response part of ``query`` (= prompt + response as OpenRLHF decodes it), end markers removed."""
    if prompt and query.startswith(prompt):
        return strip_end_markers(query[len(prompt) :])
    for marker in ASSISTANT_MARKERS:  # re-decoded prompts can differ (e.g. expanded image tokens)
        position = query.rfind(marker)
        if position >= 0:
            return strip_end_markers(query[position + len(marker) :])
    return strip_end_markers(query)


def failure_reward_of_label(label: Any) -> float:
    """The failure reward of the task ``label`` names (:func:`adora_openrlhf.rewards.base.failure_reward`), or 0.0
    when the label names none; never raises."""
    from adora_openrlhf.rewards.base import failure_reward

    try:
        source, _, meta = decode_reward_label(label)
    except Exception:  # noqa: BLE001 - an error path: the caller reports the label's own error
        return 0.0
    return failure_reward(source, meta)


_THREADS = None


def call_grader():
    """A grader for one ``reward_func`` call: the run's ``grading`` section from the environment
    (rewards/grading.py :func:`config_from_env`), its own deadline, and the process's grading threads, shared by
    the calls that OpenRLHF makes at the same time from its own threads."""
    global _THREADS
    from adora_openrlhf.rewards.grading import GradingThreads, StepGrader, config_from_env

    config = config_from_env()
    if _THREADS is None:
        _THREADS = GradingThreads(config.workers)
    return StepGrader(config, threads=_THREADS)


def _guarded(reward_fn):
    """``reward_fn`` that logs and reports a failure instead of raising: one bad row must not stop the rollout."""

    def call(response: str, label: str, meta: Mapping[str, Any]):
        try:
            return reward_fn(response, label, meta)
        except Exception as err:  # noqa: BLE001 - scored as the task's failure reward, counted in reward_error
            logger.error("reward_func: cannot score a rollout (%s: %s)", type(err).__name__, err)
            return None

    return call


def _failed(label: Any) -> tuple[float, float, dict[str, float]]:
    """``(reward, score, logs)`` of a rollout that could not be scored: the task's failure reward, ``reward_error = 1``."""
    return failure_reward_of_label(label), 0.0, {**dict.fromkeys(EXTRA_LOG_KEYS, 0.0), "reward_error": 1.0}


def _logs_of(result) -> dict[str, float]:
    logs = dict.fromkeys(EXTRA_LOG_KEYS, 0.0)
    logs["correct"] = float(result.correct)
    logs["answer_found"] = float(result.extracted is not None)
    for key in ("grader_timeout", "grader_error", "grader_late"):
        logs[key] = float(result.info.get(key, 0.0))
    return logs


def score_batch(
    queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]
) -> list[tuple[float, float, dict[str, float]]]:
    """``(reward, score, logs)`` of every rollout, graded together under one deadline per call (OpenRLHF 0.11.2
    calls the hook once per response, from several threads at once: each response's grading is bounded by the
    deadline).

    A row whose label does not decode, whose source is unknown or whose reward function raises scores the task's
    failure reward with ``reward_error = 1`` and is logged; a row not graded by the deadline scores it with
    ``grader_late = 1``."""
    from adora_openrlhf.rewards.base import failure_reward, get_reward_fn
    from adora_openrlhf.rewards.grading import GradingJob

    out: list[tuple[float, float, dict[str, float]] | None] = [None] * len(queries)
    jobs, where = [], []
    for i, (query, prompt, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        try:
            source, truth, meta = decode_reward_label(label)
            meta.setdefault("think_opened_in_prompt", (prompt or "").rstrip().endswith("<think>"))
            reward_fn = get_reward_fn(source)
        except Exception as err:  # noqa: BLE001 - one bad row must not stop the rollout
            logger.error("reward_func: cannot score a rollout (%s: %s)", type(err).__name__, err)
            out[i] = _failed(label)
            continue
        jobs.append(
            GradingJob(
                _guarded(reward_fn),
                split_response(query or "", prompt or ""),
                truth,
                meta,
                failure_reward(source, meta),
            )
        )
        where.append(i)
    for i, result in zip(where, call_grader().grade(jobs), strict=True):
        if result is None:
            out[i] = _failed(labels[i])
        else:
            out[i] = (float(result.reward), float(result.correct), _logs_of(result))
    return out  # type: ignore[return-value]


def score_one(query: str, prompt: str, label: Any) -> tuple[float, float, dict[str, float]]:
    """``(reward, score, logs)`` of one rollout (:func:`score_batch` of one)."""
    return score_batch([query], [prompt], [label])[0]


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    """OpenRLHF's hook: per-row rewards by the row's source, 0/1 scores, and per-sample logs as tensors."""
    import torch

    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(f"reward_func: got {len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels")
    scored = score_batch(queries, prompts, labels)
    return {
        "rewards": torch.tensor([reward for reward, _, _ in scored], dtype=torch.float32),
        "scores": torch.tensor([score for _, score, _ in scored], dtype=torch.float32),
        "extra_logs": {
            key: torch.tensor([logs[key] for _, _, logs in scored], dtype=torch.float32) for key in EXTRA_LOG_KEYS
        },
    }
