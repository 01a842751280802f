"""Evaluation: pass@k against the closed form, report numbers against a hand count on the per-sample
file, resume without duplicated work, grader crashes isolated, bad flags."""

import json
import math
from itertools import combinations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.evaluation.benchmarks import Benchmark, get_benchmark, read_jsonl
from adora_openrlhf.evaluation.generation import Completion
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, evaluate_benchmark, read_records
from adora_openrlhf.evaluation.metrics import ks_for, pass_at_k, score_records
from adora_openrlhf.evaluation.report import write_report
from adora_openrlhf.evaluation.run import main


def brute_force_pass_at_k(n, c, k):
    """Fraction of k-subsets of the n samples that contain at least one correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@given(n=st.integers(1, 10), data=st.data())
def test_pass_at_k_matches_closed_form(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_hand_values_and_errors():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)


def completion(text):
    return Completion(text, len(text.split()), False)


class ScriptedGenerator:
    """Engine boundary stand-in: answers the K&K label for problems whose index is even, nonsense otherwise,
    and counts what it was asked to generate."""

    def __init__(self):
        self.calls = []

    def generate(self, rows, k, seeds=None, progress=None):
        self.calls.append(len(rows))
        out = []
        for row in rows:
            good = f"<think>ok</think><answer>{row['label']}</answer>"
            out.append([completion(good if (row["meta"]["seq"] % 2 == 0 or i == 0) else "no idea") for i in range(k)])
        return out


@pytest.fixture
def kk_rows():
    from adora_openrlhf.tasks.kk import generate_rows

    rows = generate_rows(3, [2], seed=1) + generate_rows(3, [6], seed=2)
    for seq, row in enumerate(rows):
        row["meta"]["seq"] = seq
    return rows


def test_report_matches_hand_count_and_resume_skips_finished(tmp_path, kk_rows):
    bench = get_benchmark("kk")
    out = tmp_path / SAMPLES_FILE
    gen = ScriptedGenerator()
    assert evaluate_benchmark(bench, kk_rows[:4], gen, k=4, out_path=out, batch_problems=2) == 4
    # resume with the full list: only the 2 unfinished problems are generated
    assert evaluate_benchmark(bench, kk_rows, gen, k=4, out_path=out, batch_problems=2) == 2
    assert gen.calls == [2, 2, 2]
    assert evaluate_benchmark(bench, kk_rows, gen, k=4, out_path=out) == 0
    records = read_records(out)
    assert len(records) == 6 * 4
    assert len({(r["problem_id"], r["sample_index"]) for r in records}) == 24
    # hand count from the per-sample file: even problems 4/4 correct, odd 1/4
    per_problem = {}
    for r in records:
        per_problem.setdefault(r["problem_id"], []).append(r["correct"])
    expected_avg = sum(sum(v) / 4 for v in per_problem.values()) / 6
    expected_pass2 = sum(pass_at_k(4, sum(v), 2) for v in per_problem.values()) / 6
    write_report(tmp_path, 4, ["kk"], {"model": "scripted"})
    report = json.loads((tmp_path / "report.json").read_text())
    overall = next(r for r in report["rows"] if r["subset"] == "all")
    assert overall["problems"] == 6 and overall["avg_at_k"] == pytest.approx(expected_avg)
    assert overall["pass_at"]["2"] == pytest.approx(expected_pass2)
    assert overall["pass_at"]["4"] == 1.0
    subsets = {r["subset"]: r for r in report["rows"]}
    assert set(subsets) == {"all", "ppl=2", "ppl=6", "ID", "OOD"}
    assert subsets["ppl=2"]["problems"] == 3 and subsets["ID"]["avg_at_k"] == subsets["ppl=2"]["avg_at_k"]
    assert "| kk | all | 6 |" in (tmp_path / "report.md").read_text()


def test_torn_last_line_is_redone(tmp_path, kk_rows):
    bench = get_benchmark("kk")
    out = tmp_path / SAMPLES_FILE
    evaluate_benchmark(bench, kk_rows[:1], ScriptedGenerator(), k=2, out_path=out)
    with open(out, "a") as handle:
        handle.write('{"benchmark": "kk", "problem_id": "1", "sampl')  # interrupted mid-write
    gen = ScriptedGenerator()
    assert evaluate_benchmark(bench, kk_rows[:2], gen, k=2, out_path=out) == 1
    assert len(read_records(out)) == 4


def test_grader_crash_is_isolated(tmp_path, kk_rows):
    def flaky(source, response, row):
        if row["meta"]["seq"] == 1:
            raise RuntimeError("grader bug")
        return {"correct": True, "reward": 1.0, "extracted": "x", "grader_error": None}

    from adora_openrlhf.evaluation.loop import grade

    bench = Benchmark("kk", "kk", lambda row: [])
    out = tmp_path / SAMPLES_FILE

    def safe(source, response, row):
        try:
            return flaky(source, response, row)
        except RuntimeError:
            return grade("no-such-source", response, row)

    evaluate_benchmark(bench, kk_rows[:3], ScriptedGenerator(), k=1, out_path=out, grade_fn=safe)
    records = read_records(out)
    assert [r["correct"] for r in records] == [True, False, True]
    assert "unknown reward source 'no-such-source'" in records[1]["grader_error"]


def test_a_crashing_grader_scores_the_tasks_failure_reward(monkeypatch):
    """eval.run's fallback for a grader that raises is the task's lowest reward, never above a wrong answer."""
    from adora_openrlhf.evaluation.loop import grade
    from adora_openrlhf.rewards import base

    def crashing(response, label, meta):
        raise RuntimeError("grader bug")

    monkeypatch.setitem(base.REWARD_FUNCTIONS._entries, "dapo_math", crashing)
    monkeypatch.setitem(base.REWARD_FUNCTIONS._entries, "kk", crashing)
    dapo = grade("dapo_math", "Answer: 42", {"label": "42", "meta": {"reward_style": "dapo"}})
    assert dapo["reward"] == -1.0 and not dapo["correct"] and "grader bug" in dapo["grader_error"]
    assert grade("kk", "x", {"label": "L", "meta": {}})["reward"] == -3.0
    assert grade("no-such-source", "x", {"label": "L"})["reward"] == 0.0


def test_read_jsonl_names_bad_line(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match=r"b.jsonl:2: row has no 'label'"):
        read_jsonl(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bench", "gsm9k"], "unknown benchmark 'gsm9k'"),
        (["--k", "0"], "--k: must be between 1 and 1024, got 0"),
        (["--temperature", "0", "--k", "4"], "greedy"),
        (["--bench-file", "kk"], "NAME=PATH"),
        (["--engine", "tgi"], "unknown engine"),
        (["--dtype", "fp8"], "--dtype: unknown dtype 'fp8'"),
        (["--engine", "hf", "--vllm-arg", "enforce_eager"], "--vllm-arg: expected KEY=VALUE"),
        (["--engine", "hf", "--vllm-arg", "max_model_len=64"], "--vllm-arg: only used by the vLLM engine"),
        (["--vllm-arg", "dtype=half"], "--vllm-arg dtype: set by --dtype"),
        (["--numerics", "quick"], "--numerics: unknown 'quick'; choose one of auto, exact, fast"),
        (["--workers", "0"], "--workers: expected a whole number >= 1 or auto, got '0'"),
        (["--workers", "two"], "--workers: expected a whole number >= 1 or auto"),
        (
            ["--engine", "hf", "--numerics", "exact", "--workers", "2"],
            "--workers 2: several decoding processes need --numerics fast",
        ),
    ],
)
def test_cli_errors(argv, message, tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "o")] + argv) == 2
    assert message in capsys.readouterr().err


def test_numerics_auto_is_exact_only_where_the_run_is_repeated_greedily():
    from adora_openrlhf.evaluation.cli import resolve_decoding

    # repeats the trainer's eval/greedy_accuracy
    assert resolve_decoding("auto", "auto", "hf", temperature=0.0, run_numerics="exact") == (
        "exact",
        None,
    )
    assert resolve_decoding("auto", "auto", "hf", temperature=0.6, run_numerics="exact") == ("fast", None)
    assert resolve_decoding("auto", "3", "hf", temperature=0.0) == ("fast", 3)
    assert resolve_decoding("exact", "1", "hf", temperature=0.6) == ("exact", 1)
    assert resolve_decoding("exact", "01", "hf", temperature=0.6) == ("exact", 1)
    assert resolve_decoding("fast", "auto", "hf", temperature=0.0, run_numerics="exact") == ("fast", None)
    # a run trained with model.numerics fast is repeated with its own arithmetic, in one process (its batches)
    assert resolve_decoding("auto", "auto", "hf", temperature=0.0, run_numerics="fast") == ("fast", 1)
    assert resolve_decoding("auto", "2", "hf", temperature=0.0, run_numerics="fast") == ("fast", 2)
    assert resolve_decoding("auto", "auto", "hf", temperature=0.6, run_numerics="fast") == ("fast", None)
    assert resolve_decoding("auto", "auto", "vllm", temperature=0.6) == (None, None)
    with pytest.raises(
        ValueError, match="--numerics fast: only used by the transformers engine, but the engine is 'vllm'"
    ):
        resolve_decoding("fast", "auto", "vllm", temperature=0.6)
    with pytest.raises(ValueError, match="--workers 2: only used by the transformers engine, but the engine is 'vllm'"):
        resolve_decoding("auto", "2", "vllm", temperature=0.6)
    with pytest.raises(ValueError, match="--workers 2: several decoding processes need --numerics fast"):
        resolve_decoding("auto", "2", "hf", temperature=0.0, run_numerics="exact")


def test_engine_args_and_dtype():
    from adora_openrlhf.evaluation.generation import parse_engine_args, resolve_dtype

    assert parse_engine_args(
        ["max_model_len=4096", "enforce_eager=true", 'limit_mm_per_prompt={"image": 2}', "quantization=fp8"]
    ) == {"max_model_len": 4096, "enforce_eager": True, "limit_mm_per_prompt": {"image": 2}, "quantization": "fp8"}
    assert parse_engine_args(None) == {}
    assert resolve_dtype("bfloat16") == "bfloat16"
    assert resolve_dtype("auto") == ("bfloat16" if torch.cuda.is_available() else "float32")


@given(
    key=st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True).filter(
        lambda k: k not in ("model", "seed", "dtype", "trust_remote_code")
    ),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
        max_leaves=6,
    ),
)
def test_engine_args_round_trip_json_values(key, value):
    from adora_openrlhf.evaluation.generation import parse_engine_args

    assert parse_engine_args([f"{key}={json.dumps(value)}"]) == {key: value}


def test_vllm_sampling_follows_the_documented_defaults():
    from adora_openrlhf.evaluation.cli import DEFAULT_MAX_NEW_TOKENS, build_parser
    from adora_openrlhf.evaluation.generation import EvalSampling, vllm_sampling_kwargs

    args = build_parser().parse_args(["--model", "m", "--out", "o"])
    assert args.max_new_tokens is None  # DEFAULT_MAX_NEW_TOKENS, or the run's limit with --run
    sampling = EvalSampling(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, seed=args.seed
    )
    assert sampling == EvalSampling()
    assert vllm_sampling_kwargs(sampling, 8) == {
        "n": 8,
        "temperature": 0.6,
        "top_p": 0.95,
        "max_tokens": 1024,
        "seed": 0,
        "repetition_penalty": 1.0,
    }


def test_cli_missing_model(tmp_path, capsys):
    assert main(["--model", "no_such_dir", "--out", str(tmp_path)]) == 2
    assert "--model" in capsys.readouterr().err


def test_score_records_ignores_incomplete_problems():
    recs = [{"benchmark": "b", "problem_id": "1", "subsets": [], "sample_index": 0, "correct": True}]
    assert score_records(recs, k=2) == []


def test_subsets_and_problem_ids():
    from adora_openrlhf.evaluation.loop import problem_id

    vista = {
        "prompt": "q",
        "label": "A",
        "meta": {"pid": "17", "category": "general-vqa", "task": "figure question answering"},
    }
    assert get_benchmark("mathvista").subsets(vista) == ["OOD", "task=figure question answering"]
    assert get_benchmark("math500").subsets({"meta": {"level": 3}}) == ["level=3"]
    assert get_benchmark("kk").subsets({"meta": {"num_people": 5}}) == ["ppl=5", "ID"]
    assert problem_id(vista, 4) == "17" and problem_id({"prompt": "q", "label": "1"}, 4) == "4"


def test_math_benchmark_from_data_dir_is_graded_by_math_verify(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"prompt": "1+1?", "label": "2", "source": "math500", "meta": {"id": "a", "level": 1}},
        {"prompt": "half?", "label": "\\frac{1}{2}", "source": "math500", "meta": {"id": "b", "level": 2}},
    ]
    (data / "math500.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    class Answers:
        def generate(self, rows, k, seeds=None, progress=None):
            texts = [
                ["The answer is \\boxed{2}."] * k if r["meta"]["id"] == "a" else ["\\boxed{0.5}", "\\boxed{3}"]
                for r in rows
            ]
            return [[completion(t) for t in row] for row in texts]

    from adora_openrlhf.evaluation.benchmarks import load_benchmark_rows

    bench = get_benchmark("math500")
    loaded = load_benchmark_rows(bench, None, str(data), seed=0, limit=None, cache_dir=tmp_path / "cache")
    evaluate_benchmark(bench, loaded, Answers(), k=2, out_path=tmp_path / SAMPLES_FILE)
    write_report(tmp_path, 2, ["math500"], {})
    report = {(r["subset"]): r for r in json.loads((tmp_path / "report.json").read_text())["rows"]}
    assert report["all"]["avg_at_k"] == pytest.approx(0.75)  # 2/2 and 1/2
    assert report["level=2"]["pass_at"]["2"] == 1.0 and report["level=2"]["avg_at_k"] == 0.5


def test_end_to_end_with_tiny_local_model(tmp_path):
    """A warm-started tiny model from the local backend, evaluated by `python -m eval.run` on a K&K file;
    the report equals a hand count on samples.jsonl, and a second run generates nothing new."""
    from adora_openrlhf.backends.local.trainer import warm_start
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.tasks.kk import generate_rows

    cfg = build_run_config(
        "kk-tiny",
        {
            "output_dir": str(tmp_path / "run"),
            "warmup.steps": 3,
            "data.num_train": 40,
            "data.num_eval": 4,
            "model.tiny.hidden_size": 32,
            "model.tiny.intermediate_size": 64,
            "model.tiny.num_hidden_layers": 1,
        },
    )
    model_dir = warm_start(cfg, tmp_path / "model")
    bench_file = tmp_path / "kk.jsonl"
    bench_file.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(3, [2, 3], seed=5)))
    argv = [
        "--model",
        str(model_dir),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench_file}",
        "--k",
        "2",
        "--out",
        str(tmp_path / "eval"),
        "--max-new-tokens",
        "8",
        "--engine",
        "hf",
        "--temperature",
        "1.0",
    ]
    assert main(argv) == 0
    records = read_records(tmp_path / "eval" / SAMPLES_FILE)
    assert len(records) == 6 and all(isinstance(r["response"], str) for r in records)
    hand = sum(r["correct"] for r in records) / 6
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["settings"]["numerics"] == "fast" and report["settings"]["batch_size"] == 256
    assert next(r for r in report["rows"] if r["subset"] == "all")["avg_at_k"] == pytest.approx(hand)
    assert main(argv) == 0
    assert len(read_records(tmp_path / "eval" / SAMPLES_FILE)) == 6


def test_a_reward_that_never_returns_is_scored_late_at_the_deadline_and_reported(tmp_path, kk_rows):
    """eval.run grades each generation call's samples under one grading deadline, as training does: a reward stuck
    forever costs the call the deadline; its sample scores the K&K failure reward (-3), is wrong, is marked
    grader_late and is counted in the report's notes; the other samples keep their grades."""
    import threading
    import time

    from adora_openrlhf.evaluation.loop import grade
    from adora_openrlhf.rewards.grading import GradingConfig, StepGrader

    never = threading.Event()

    def stuck_on_first(source, response, row):
        if row["meta"]["seq"] == 0 and response != "no idea":
            never.wait()  # a plug-in reward that never returns
        return grade(source, response, row)

    out = tmp_path / SAMPLES_FILE
    start = time.monotonic()
    evaluate_benchmark(
        get_benchmark("kk"), kk_rows[:2], ScriptedGenerator(), k=2, out_path=out, grade_fn=stuck_on_first,
        grader=StepGrader(GradingConfig(deadline_s=0.3)),
    )  # fmt: skip
    assert time.monotonic() - start < 5.0
    records = {(r["problem_id"], r["sample_index"]): r for r in read_records(out)}
    late = [r for r in records.values() if r["grader_late"]]
    assert len(late) == 2 and all(r["reward"] == -3.0 and not r["correct"] for r in late)  # problem seq 0, both samples
    assert sum(r["correct"] for r in records.values() if not r["grader_late"]) == 1  # seq 1: its first sample is right
    never.set()


def test_k_is_capped_and_the_grading_deadline_checked(capsys):
    from adora_openrlhf.evaluation.run import main

    for argv, message in (
        (["--k", "100000"], "--k: must be between 1 and 1024, got 100000"),
        (["--grading-deadline-s", "0"], "--grading-deadline-s: must be a finite number of seconds > 0, got 0.0"),
        (["--grading-deadline-s", "nan"], "--grading-deadline-s: must be a finite number of seconds > 0, got nan"),
    ):
        assert main(["--model", "/nonexistent", *argv]) == 2
        assert message in capsys.readouterr().err
