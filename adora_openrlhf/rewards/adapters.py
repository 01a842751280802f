"""The package's verifiable rewards (K&K, math, geometry) as reward functions of other trainers.

- :func:`as_trl_reward_func` gives TRL's custom reward function (``GRPOTrainer(reward_funcs=[...])``)::

      f(prompts, completions, **columns) -> list[float]

  TRL calls it with keyword arguments: ``prompts``, ``completions`` (one text each, or, for a conversational
  dataset, one list of message dicts ``[{"role": "assistant", "content": ...}]`` each), ``completion_ids``,
  ``trainer_state`` and every other dataset column as a list with one entry per completion. The label column
  (``label`` in the rows of ``data_prep``) holds the ground truth, ``meta`` (optional) each row's meta dict, and
  ``source`` picks the reward per row when no fixed source is given.

- :func:`as_verl_compute_score` gives verl's custom ``compute_score``
  (``custom_reward_function.path`` / ``.name``)::

      compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> {"score": float, ...}

  ``data_source`` names the reward (our rows' ``source``); the row's meta is ``extra_info["meta"]`` when the
  converted row carries one, else ``extra_info`` itself. The returned dict has the same keys for every row
  (``score``, ``acc``, ``pred``), which verl's reward managers need to collect per-sample extras.

Both return the training reward (:attr:`RewardResult.reward`, the same value the local and OpenRLHF backends
train on) by default, or the 0/1 correctness with ``value="correct"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adora_openrlhf.registry import Registry
from adora_openrlhf.rewards.base import REWARD_FUNCTIONS, RewardResult

VALUES: Registry[Callable[[RewardResult], float]] = Registry("reward value", "value")
VALUES.add("reward", lambda result: float(result.reward))
VALUES.add("correct", lambda result: float(result.correct))


def completion_text(completion: Any) -> str:
    """The response text of one completion: a string as is; a conversational completion (a list of message
    dicts, as TRL passes them) -> the content of its last assistant message (text parts joined when the
    content is a list of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, Sequence) and all(isinstance(m, Mapping) for m in completion):
        messages = [m for m in completion if m.get("role", "assistant") == "assistant"] or list(completion)
        if not messages:
            return ""
        content = messages[-1].get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, Mapping) and part.get("type", "text") == "text"
            )
    raise TypeError(f"completions: expected a string or a list of chat messages, got {type(completion).__name__}")


def _meta(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_trl_reward_func(
    source: str | None = None,
    *,
    label_key: str = "label",
    meta_key: str = "meta",
    source_key: str = "source",
    value: str = "reward",
) -> Callable[..., list[float]]:
    """TRL reward function scoring each completion with the reward of ``source`` (or, with ``source=None``, of
    each row's ``source_key`` column) against the row's ``label_key`` column.

    ``f(prompts=..., completions=..., **columns)[i] = value(reward_fn(text(completions[i]), str(label[i]), meta[i]))``.
    A missing label column is a ``ValueError`` naming it and the columns TRL passed.
    """
    if source is not None:
        REWARD_FUNCTIONS.check(source)
    pick = VALUES.get(value)

    def reward_func(
        prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **columns: Any
    ) -> list[float]:
        if label_key not in columns:
            known = sorted(k for k in columns if k not in ("completion_ids", "trainer_state"))
            raise ValueError(
                f"label_key: the dataset has no {label_key!r} column (columns: {known}); "
                f"pass as_trl_reward_func(..., label_key=NAME) with the column that holds the ground truth"
            )
        labels = columns[label_key]
        metas = columns.get(meta_key) or [None] * len(completions)
        sources = [source] * len(completions) if source is not None else columns.get(source_key)
        if sources is None:
            raise ValueError(f"source: give as_trl_reward_func a source or a dataset with a {source_key!r} column")
        return [
            pick(REWARD_FUNCTIONS.get(str(s))(completion_text(c), str(label), _meta(meta)))
            for c, label, meta, s in zip(completions, labels, metas, sources, strict=True)
        ]

    reward_func.__name__ = f"adora_{source or 'row_source'}_{value}"  # TRL logs each reward function by its name
    reward_func.__qualname__ = reward_func.__name__
    return reward_func


def as_verl_compute_score(value: str = "reward") -> Callable[..., dict[str, Any]]:
    """verl ``compute_score`` that grades ``solution_str`` with the reward registered for ``data_source``.

    Returns ``{"score": value(result), "acc": 1.0 | 0.0, "pred": extracted answer or ""}``; an unknown
    ``data_source`` raises the registry's one-line error listing the known sources.
    """
    pick = VALUES.get(value)

    def compute_score(
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        info = _meta(extra_info)
        meta = info["meta"] if isinstance(info.get("meta"), Mapping) else info
        result = REWARD_FUNCTIONS.get(str(data_source))(str(solution_str), str(ground_truth), meta)
        return {"score": pick(result), "acc": float(result.correct), "pred": result.extracted or ""}

    return compute_score
