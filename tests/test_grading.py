"""A step's grading runs concurrently under one deadline (rewards/grading.py), on both backends' reward paths."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.rewards.base import RewardResult
from adora_openrlhf.rewards.grading import GradingConfig, GradingJob, StepGrader, config_from_env, late_result


def value_reward(response: str, label: str, meta) -> RewardResult:
    """Reward = float(response), correct when it equals the label; sleeps meta['sleep'] seconds first."""
    time.sleep(float(meta.get("sleep", 0.0)))
    return RewardResult(reward=float(response), correct=response == label, extracted=response, info={"graded": 1.0})


def job(value: float, sleep: float = 0.0, failure: float = -3.0, fn=value_reward) -> GradingJob:
    return GradingJob(fn, str(value), "1.0", {"sleep": sleep}, failure)


def test_results_come_back_in_order_and_equal_grading_one_at_a_time():
    jobs = [job(v) for v in (1.0, 0.5, -2.0, 1.0)]
    grader = StepGrader(GradingConfig(deadline_s=30, workers=3))
    assert grader.grade(jobs) == [value_reward(j.response, j.label, j.meta) for j in jobs]
    assert grader.late == 0 and grader.grade([]) == []


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), max_size=20), st.integers(1, 6))
def test_any_worker_count_gives_the_sequential_grades(values, workers):
    jobs = [job(v) for v in values]
    results = StepGrader(GradingConfig(deadline_s=30, workers=workers)).grade(jobs)
    assert [r.reward for r in results] == [float(str(v)) for v in values]


def test_a_slow_grade_scores_the_failure_reward_at_the_deadline_and_is_counted():
    grader = StepGrader(GradingConfig(deadline_s=0.3, workers=2))
    started = time.monotonic()
    results = grader.grade([job(1.0), job(1.0, sleep=3.0, failure=-3.0), job(0.5)])
    waited = time.monotonic() - started
    assert waited < 1.5  # the deadline, not the slow call's 3 s
    assert results[0].reward == 1.0 and results[2].reward == 0.5
    assert results[1] == late_result(-3.0) and results[1].reward == -3.0 and not results[1].correct
    assert results[1].info["grader_late"] == 1.0 and grader.late == 1


def test_the_deadline_is_a_budget_for_the_whole_step_across_its_rounds():
    clock = [0.0]
    grader = StepGrader(GradingConfig(deadline_s=10.0, workers=1), clock=lambda: clock[0])

    def slow(response, label, meta):  # takes 7 "seconds" of the fake clock
        clock[0] += 7.0
        return value_reward(response, label, {})

    grader.grade([job(1.0, fn=slow)])
    assert grader.waited_s == 7.0  # 3 s left for the step's next round
    assert grader.late == 0
    grader.start_step()
    assert grader.waited_s == 0.0 and grader.late == 0


def test_a_round_after_the_budget_is_spent_scores_late_without_waiting():
    grader = StepGrader(GradingConfig(deadline_s=0.2, workers=1))
    # spends the whole budget (late at 0.2 s); a second of sleep, so that a busy machine's late wake-up from the wait
    # cannot find it finished
    grader.grade([job(1.0, sleep=1.0)])
    started = time.monotonic()
    results = grader.grade([job(1.0, sleep=0.5), job(0.5, sleep=0.5)])
    assert time.monotonic() - started < 0.4 and [r.info.get("grader_late") for r in results] == [1.0, 1.0]
    assert grader.late == 3
    grader.start_step()
    assert grader.grade([job(0.5)])[0].reward == 0.5  # a new step has its full budget again


def test_calls_queued_behind_the_deadline_never_run():
    calls = []

    def counted(response, label, meta):
        calls.append(response)
        time.sleep(1.0)  # far past the deadline: still running when the grader looks, however late it wakes
        return value_reward(response, label, {})

    grader = StepGrader(GradingConfig(deadline_s=0.1, workers=1))
    results = grader.grade([job(float(i), fn=counted) for i in range(6)])
    time.sleep(0.5)
    assert len(calls) == 1 and grader.late == 6 and all(r.reward == -3.0 for r in results)


def test_a_call_stuck_forever_neither_blocks_the_next_step_nor_keeps_the_thread():
    release = threading.Event()

    def stuck(response, label, meta):
        release.wait()
        return value_reward(response, label, {})

    grader = StepGrader(GradingConfig(deadline_s=0.2, workers=1))
    assert grader.grade([job(1.0, fn=stuck)])[0].info["grader_late"] == 1.0
    grader.start_step()
    assert grader.grade([job(0.5)])[0].reward == 0.5  # a replacement thread grades the next step
    release.set()
    assert all(t.daemon for t in threading.enumerate() if t.name == "adora-grader")  # never holds the process open


def test_a_reward_function_that_raises_propagates_as_grading_one_at_a_time_would():
    def broken(response, label, meta):
        raise KeyError("meta.names")

    with pytest.raises(KeyError, match="meta.names"):
        StepGrader(GradingConfig(deadline_s=5)).grade([job(1.0), job(1.0, fn=broken)])


@pytest.mark.parametrize(
    "section, field",
    [({"deadline_s": 0}, "grading.deadline_s"), ({"deadline_s": -1.0}, "grading.deadline_s"), ({"deadline_s": float("inf")}, "grading.deadline_s"),
     ({"deadline_s": "60"}, "grading.deadline_s"), ({"workers": 0}, "grading.workers"), ({"workers": 2.5}, "grading.workers"),
     ({"workers": True}, "grading.workers")],
)  # fmt: skip
def test_bad_grading_settings_are_refused_naming_the_field(section, field):
    with pytest.raises((ConfigError, ValueError), match=field):
        RunConfig.from_dict({"grading": section})


def test_the_grading_section_reaches_ray_workers_through_the_environment():
    assert config_from_env({}) == GradingConfig()
    assert config_from_env({"ADORA_GRADING_DEADLINE_S": "2.5", "ADORA_GRADING_WORKERS": "3"}) == GradingConfig(
        deadline_s=2.5, workers=3
    )
    with pytest.raises(ValueError, match="ADORA_GRADING_WORKERS"):
        config_from_env({"ADORA_GRADING_WORKERS": "many"})
    with pytest.raises((ConfigError, ValueError), match="grading.deadline_s"):
        config_from_env({"ADORA_GRADING_DEADLINE_S": "-1"})


def test_pathological_math_answers_do_not_hold_a_step_past_the_deadline():
    """The issue's case: 64 answers that take math-verify up to its 10 s limit each ('(' x 5000, a tower of powers).
    Graded one at a time they held a step for minutes; here the step waits the deadline, and they score as wrong."""
    from adora_openrlhf.rewards.base import failure_reward
    from adora_openrlhf.rewards.math import math_reward

    meta = {"reward_style": "math_verify"}
    warm = StepGrader(GradingConfig(deadline_s=120, workers=4))
    assert warm.grade([GradingJob(math_reward, "\\boxed{2}", "2", meta, 0.0)] * 4)[0].correct  # grading workers started
    answers = ["\\boxed{" + "(" * 5000 + "}", "\\boxed{10^{10^{10}}}"] * 32
    grader = StepGrader(GradingConfig(deadline_s=3.0, workers=4))
    started = time.monotonic()
    results = grader.grade([GradingJob(math_reward, a, "7", meta, failure_reward("math500", meta)) for a in answers])
    assert time.monotonic() - started < 3.0 + 2.0
    assert all(not r.correct and r.reward == 0.0 for r in results)
    assert grader.late > 0  # 64 answers x up to 10 s on 4 workers cannot all finish in 3 s


def test_the_local_engine_scores_late_responses_with_the_failure_reward_and_logs_them(monkeypatch):
    """RolloutEngine.score grades a round's responses through the step's grader; the K&K failure reward is -3."""
    from adora_openrlhf.engine.rollout import RolloutEngine
    from adora_openrlhf.rows import Row

    class Decode:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    rows = [Row(prompt="p", label="(1) Alice is a knight", source="kk", meta={"names": ["Alice"]})] * 2

    def slow_for_row_1(text, label, meta):
        time.sleep(2.0 if text == "9" else 0.0)
        return RewardResult(reward=1.0, correct=True)

    engine = RolloutEngine(
        None,
        Decode(),
        [[1], [2]],
        rows,
        [slow_for_row_1] * 2,
        0.5,
        settings=None,
        grader=StepGrader(GradingConfig(deadline_s=0.3)),
    )
    engine.reset_timers()
    scored = engine.score([(0, [1], [5], False), (1, [2], [9], True)])
    assert [s.reward for s in scored] == [1.0, -3.0] and [s.positive for s in scored] == [True, False]
    assert scored[1].payload.info["grader_late"] == 1.0 and scored[1].truncated and engine.grader.late == 1
    engine.reset_timers()
    assert engine.grader.late == 0


def test_the_openrlhf_hook_scores_a_row_past_the_deadline_with_the_failure_reward(monkeypatch):
    import adora_openrlhf.rewards.openrlhf_reward as hook
    from adora_openrlhf.rewards import base

    def slow_kk(response, label, meta):
        time.sleep(2.0)
        return RewardResult(reward=3.0, correct=True)

    monkeypatch.setitem(base.REWARD_FUNCTIONS._entries, "kk", slow_kk)
    monkeypatch.setenv("ADORA_GRADING_DEADLINE_S", "0.3")
    label = hook.encode_reward_label("kk", "(1) Alice is a knight", {"names": ["Alice"]})
    started = time.monotonic()
    result = hook.reward_func(["<answer>x</answer>"], [""], [label])
    assert time.monotonic() - started < 1.5
    assert result["rewards"].tolist() == [-3.0] and result["scores"].tolist() == [0.0]
    assert result["extra_logs"]["grader_late"].tolist() == [1.0] and result["extra_logs"]["reward_error"].tolist() == [
        0.0
    ]


def test_a_held_out_evaluation_scores_a_reward_that_never_returns_at_the_deadline():
    """engine/evaluate.py grades under the run's deadline like a training step: a reward stuck forever on one
    response costs each view the deadline, the response scores the task's failure reward (K&K: -3, wrong),
    and each view counts its late responses."""
    from adora_openrlhf.config import SamplingParams
    from adora_openrlhf.engine.evaluate import evaluate
    from adora_openrlhf.rows import Row

    class Decode:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    class Generation:  # the GenerationSettings.generate interface: one (response ids, truncated) per prompt
        def generate(self, model, tokenizer, prompts, params, greedy, extras=None):
            return [([prompt[0] + 4], False) for prompt in prompts]

    never = threading.Event()

    def stuck_on_9(text, label, meta):
        if text == "9":
            never.wait()  # a plug-in reward that never returns
        return RewardResult(reward=1.0, correct=True, info={"format_ok": 1.0})

    rows = [Row(prompt="p", label="(1) Alice is a knight", source="kk", meta={"names": ["Alice"]})] * 2
    start = time.monotonic()
    metrics = evaluate(
        None, Decode(), [[1], [5]], rows, [stuck_on_9] * 2, SamplingParams(), samples=2, settings=Generation(),
        grader=StepGrader(GradingConfig(deadline_s=0.3)),
    )  # fmt: skip
    assert time.monotonic() - start < 2.0  # a deadline per view
    assert metrics["eval/greedy_accuracy"] == 0.5 and metrics["eval/greedy_reward"] == (1.0 - 3.0) / 2
    assert (
        metrics["eval/greedy_grader_late"] == 1.0 and metrics["eval/sampled_grader_late"] == 2.0
    )  # fast grades in time
    assert metrics["eval/sampled_accuracy"] == 0.5 and metrics["eval/greedy_format"] == 0.5
    never.set()


def test_the_local_trainer_evaluates_with_the_runs_grading_section():
    """The trainer's held-out evaluations get their own StepGrader with the run's ``grading`` section."""
    import inspect

    from adora_openrlhf.backends.local import trainer

    source = inspect.getsource(trainer)
    assert "self.eval_grader = StepGrader(cfg.grading)" in source and "grader=self.eval_grader" in source
