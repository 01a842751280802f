"""OpenRLHF reward hook: loaded and called the way openrlhf 0.11.2 does it, with converter rows."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import adora_openrlhf.rewards.openrlhf_reward as hook
from adora_openrlhf.datafiles import write_jsonl
from adora_openrlhf.tasks import kk

HOOK_FILE = Path(hook.__file__)


def _load_like_openrlhf():
    """openrlhf.utils.agent.SingleTurnAgentExecutor: spec_from_file_location("reward_func", path)."""
    spec = importlib.util.spec_from_file_location("reward_func", str(HOOK_FILE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def _chat(messages, think_open=False) -> str:
    """A Qwen2.5-style chat template rendering with the generation prompt."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n" + ("<think>" if think_open else "")


def _rows_through_jsonl(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    write_jsonl(rows, path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _as_openrlhf_would(reward_func, queries, prompts, labels):
    """Call from a worker thread one row at a time (asyncio.to_thread, batch size 1) and build info like
    openrlhf.trainer.ppo_utils.samples_generator._process_response_into_experience."""

    async def run():
        return await asyncio.gather(
            *[
                asyncio.to_thread(reward_func, [q], [p], [label])
                for q, p, label in zip(queries, prompts, labels, strict=True)
            ]
        )

    infos = []
    for result in asyncio.run(run()):
        reward_val, score_val = result["rewards"], result["scores"]
        info = {"reward": torch.tensor([reward_val]), "score": torch.tensor([score_val])}
        for key, value in result["extra_logs"].items():
            if isinstance(value, torch.Tensor):
                value = value.flatten()[0].item()
            info[key] = torch.tensor([value])
        infos.append(info)
    return infos


def test_kk_rows_end_to_end(tmp_path):
    rows = _rows_through_jsonl(tmp_path, kk.generate_rows(3, [3], seed=1))
    reward_func = _load_like_openrlhf()
    prompts = [_chat(r["prompt"]) for r in rows]
    responses = [
        f"<think>reasoning</think><answer>{rows[0]['label']}</answer><|im_end|>",
        "<think>reasoning</think><answer>no idea</answer><|im_end|>",
        "just an answer<|im_end|>",
    ]
    queries = [p + r for p, r in zip(prompts, responses, strict=True)]
    infos = _as_openrlhf_would(reward_func, queries, prompts, [r["reward_label"] for r in rows])
    assert [i["reward"].item() for i in infos] == [3.0, -1.0, -3.0]
    assert [i["score"].item() for i in infos] == [1.0, 0.0, 0.0]
    assert all(i["reward"].shape == (1,) for i in infos)
    assert [set(i) for i in infos] == [{"reward", "score", *hook.EXTRA_LOG_KEYS}] * 3  # same keys for every row


def test_think_opened_by_template(tmp_path):
    row = _rows_through_jsonl(tmp_path, kk.generate_rows(1, [2], seed=2))[0]
    prompt = _chat(row["prompt"], think_open=True)
    query = prompt + f"reasoning</think><answer>{row['label']}</answer><|im_end|>"
    result = hook.reward_func([query], [prompt], [row["reward_label"]])
    assert result["rewards"].tolist() == [3.0]


def test_mixed_sources_batch_shapes():
    labels = [
        hook.encode_reward_label("kk", "(1) Alice is a knight\n(2) Bob is a knave", {"names": ["Alice", "Bob"]}),
        hook.encode_reward_label("dapo_math", "42", {"reward_style": "dapo"}),
        hook.encode_reward_label("math500", "\\frac{1}{2}", {"reward_style": "math_verify"}),
        hook.encode_reward_label("mathvista", "6", {"question_type": "multi_choice", "choices": ["3", "6"]}),
    ]
    responses = [
        "<think>t</think><answer>(1) Alice is a knight\n(2) Bob is a knave</answer>",
        "work\nAnswer: 41",
        "\\boxed{0.5}",
        "<think>t</think>\\boxed{B}",
    ]
    prompts = ["<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"] * 4
    result = hook.reward_func([p + r for p, r in zip(prompts, responses, strict=True)], prompts, labels)
    assert result["rewards"].dtype == torch.float32 and result["rewards"].shape == (4,)
    assert result["rewards"].tolist() == pytest.approx([3.0, -1.0, 1.0, 1.0])
    assert result["scores"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert set(result["extra_logs"]) == set(hook.EXTRA_LOG_KEYS)
    assert all(v.shape == (4,) for v in result["extra_logs"].values())


def test_bad_label_scores_zero_and_is_counted(monkeypatch):
    monkeypatch.delenv(hook.SOURCE_ENV, raising=False)
    result = hook.reward_func(["<|im_start|>assistant\nhi"], ["p"], ["plain label"])
    assert result["rewards"].tolist() == [0.0] and result["extra_logs"]["reward_error"].tolist() == [1.0]
    with pytest.raises(ValueError, match="--data.label_key reward_label"):
        hook.decode_reward_label("plain label")


def test_a_row_that_fails_to_score_gets_its_tasks_lowest_reward(monkeypatch):
    """Never above a wrong answer: a K&K row whose label does not parse scores -3, a DAPO row whose reward
    function crashes -1 (not 0, which would beat every wrong DAPO answer)."""
    from adora_openrlhf.rewards import base

    bad_kk = hook.encode_reward_label("kk", "Alice is", {"names": ["Alice"]})
    dapo = hook.encode_reward_label("dapo_math", "42", {"reward_style": "dapo"})
    prompt = "<|im_start|>assistant\n"
    result = hook.reward_func([prompt + "<think>t</think><answer>x</answer>"], [prompt], [bad_kk])
    assert result["rewards"].tolist() == [-3.0] and result["extra_logs"]["reward_error"].tolist() == [1.0]

    def crashing(response, label, meta):
        raise RuntimeError("grader bug")

    monkeypatch.setitem(base.REWARD_FUNCTIONS._entries, "dapo_math", crashing)
    result = hook.reward_func([prompt + "Answer: 42"], [prompt], [dapo])
    assert result["rewards"].tolist() == [-1.0] and result["scores"].tolist() == [0.0]
    assert result["extra_logs"]["reward_error"].tolist() == [1.0]
    assert hook.failure_reward_of_label(dapo) == -1.0 and hook.failure_reward_of_label("not json") == 0.0


def test_grader_timeout_scores_the_wrong_reward_through_the_hook():
    dapo = hook.encode_reward_label("dapo_math", "\\frac{1}{2}", {"reward_style": "dapo", "grader_timeout_s": 1.0})
    prompt = "<|im_start|>assistant\n"
    result = hook.reward_func([prompt + "Answer: 9^{9^{9^{9}}}", prompt + "Answer: 3"], [prompt] * 2, [dapo] * 2)
    assert result["rewards"].tolist() == [-1.0, -1.0]
    assert result["extra_logs"]["grader_timeout"].tolist() == [1.0, 0.0]


def test_plain_label_with_source_env(monkeypatch):
    monkeypatch.setenv(hook.SOURCE_ENV, "dapo_math")
    result = hook.reward_func(["Q: x\nAssistant: Answer: 7"], ["Q: x\n"], ["7"])
    assert result["rewards"].tolist() == [1.0]


def test_split_response():
    assert hook.split_response("PROMPTresp", "PROMPT") == "resp"
    # a re-decoded prompt that differs (expanded image tokens) falls back to the assistant marker
    q = "<|im_start|>user\n<|image_pad|><|image_pad|>x<|im_end|>\n<|im_start|>assistant\nthe answer"
    assert hook.split_response(q, "<|im_start|>user\n<|image_pad|>x<|im_end|>\n<|im_start|>assistant\n") == "the answer"


def test_decode_accepts_dict_and_json():
    label = hook.encode_reward_label("kk", "L", {"a": 1})
    assert hook.decode_reward_label(label) == ("kk", "L", {"a": 1})
    assert hook.decode_reward_label(json.loads(label)) == ("kk", "L", {"a": 1})


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="queries"):
        hook.reward_func(["a", "b"], ["a"], ["x", "y"])


def test_math_rows_from_worker_threads(tmp_path):
    """math-verify grading from OpenRLHF's worker threads goes through the grading subprocess."""
    from adora_openrlhf.data_prep.math_eval import convert_math_row

    rows = _rows_through_jsonl(
        tmp_path,
        [
            convert_math_row({"problem": "p", "answer": "\\frac{1}{2}"}, 1, "math500"),
            convert_math_row({"problem": "q", "answer": "3"}, 2, "amc23"),
        ],
    )
    prompts = [_chat(r["prompt"]) for r in rows]
    responses = ["<think>t</think> so \\boxed{0.5}<|im_end|>", "<think>t</think> so \\boxed{4}<|im_end|>"]
    infos = _as_openrlhf_would(
        _load_like_openrlhf(),
        [p + r for p, r in zip(prompts, responses, strict=True)],
        prompts,
        [r["reward_label"] for r in rows],
    )
    assert [i["reward"].item() for i in infos] == [1.0, 0.0]
    assert [i["grader_timeout"].item() + i["grader_error"].item() for i in infos] == [0.0, 0.0]


def test_reward_file_that_cannot_import_the_package_fails_at_load(tmp_path):
    """Loaded the way OpenRLHF's executor loads it, in a process where adora_openrlhf is not importable: the load
    fails with the install hint instead of every rollout scoring 0."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import importlib.abc, importlib.util, sys

        class NoPackage(importlib.abc.MetaPathFinder):  # a node without the package installed
            def find_spec(self, name, path=None, target=None):
                if name == "adora_openrlhf" or name.startswith("adora_openrlhf."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoPackage())
        spec = importlib.util.spec_from_file_location("reward_func", {str(HOOK_FILE)!r})
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as err:
            print("LOAD FAILED:", err)
            sys.exit(3)
        rewards = module.reward_func(["x"], [""], ['{{"source": "kk", "label": "a", "meta": {{}}}}'])["rewards"]
        print("LOADED; reward of a correct K&K answer:", rewards.tolist())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the reward file cannot import adora_openrlhf" in done.stdout and "pip install -e <repo>" in done.stdout


def test_end_of_turn_tokens_do_not_hide_the_answer():
    # OpenRLHF decodes the query with special tokens kept: "Answer: 7<|im_end|>" must grade like "Answer: 7"
    from adora_openrlhf.rewards.openrlhf_reward import encode_reward_label, score_one, split_response, strip_end_markers

    assert strip_end_markers("Answer: 7<|im_end|><|endoftext|><|endoftext|>") == "Answer: 7"
    assert strip_end_markers("x </s>\n") == "x "
    assert strip_end_markers("no marker") == "no marker"
    assert split_response("Q: 3+4?Answer: 7<|im_end|>", "Q: 3+4?") == "Answer: 7"
    label = encode_reward_label("dapo_math", "7", {})
    with_marker = score_one("Q: 3+4?<think>x</think>Answer: 7<|im_end|>", "Q: 3+4?", label)
    without = score_one("Q: 3+4?<think>x</think>Answer: 7", "Q: 3+4?", label)
    assert with_marker[0] == without[0] == 1.0


def _old_strip_end_markers(response: str) -> str:
    """The definition before it was made linear (it sliced a copy per marker), as the reference."""
    text = response
    while True:
        stripped = text.rstrip()
        for marker in hook.END_MARKERS:
            if stripped.endswith(marker):
                text = stripped[: -len(marker)]
                break
        else:
            return text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*hook.END_MARKERS, " ", "\n", "x", "Answer: 7", "<|im_", "end|>"]), max_size=10))
def test_property_strip_end_markers_as_before(parts):
    text = "".join(parts)
    assert hook.strip_end_markers(text) == _old_strip_end_markers(text)


def test_strip_end_markers_is_linear():
    import time

    start = time.monotonic()
    assert hook.strip_end_markers("x" + "<|im_end|> " * 100_000) == "x"
    assert time.monotonic() - start < 2.0
