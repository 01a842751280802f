"""eval.run never mixes models or settings in one --out, refuses repeated problem ids, and reproduces an
interrupted batch's samples (each problem sampled under its own seed)."""

import json

import pytest

from eval.benchmarks import get_benchmark
from eval.generation import EvalSampling, HFGenerator
from eval.run import CONFIG_FILE, SAMPLES_FILE, evaluate_benchmark, main, problem_seed, read_records


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random-init tiny model and tokenizer on disk (no training: samples are random text)."""
    from adora_openrlhf.backends.local.model import build_tiny_model
    from adora_openrlhf.backends.local.tokenization import train_bpe_tokenizer
    from adora_openrlhf.config import TinyModelConfig
    from data_prep.kk import generate_rows

    root = tmp_path_factory.mktemp("model")
    rows = generate_rows(20, [2], seed=5)
    tok = train_bpe_tokenizer([m["content"] for r in rows for m in r["prompt"]] + [r["label"] for r in rows], 300)
    small = TinyModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    build_tiny_model(small, tok, seed=0).save_pretrained(str(root / "m"))
    tok.save_pretrained(str(root / "m"))
    bench_file = root / "kk.jsonl"
    bench_file.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(4, [2], seed=7)))
    return root / "m", bench_file


def _argv(model, bench_file, out, *extra):
    return [
        "--model",
        str(model),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench_file}",
        "--k",
        "2",
        "--out",
        str(out),
        "--max-new-tokens",
        "6",
        "--engine",
        "hf",
        "--temperature",
        "1.0",
        *extra,
    ]


def test_rerun_with_other_settings_is_refused_and_writes_nothing(tiny_model, tmp_path, capsys):
    model, bench_file = tiny_model
    out = tmp_path / "eval"
    assert main(_argv(model, bench_file, out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    other_model = tmp_path / "other"
    other_model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if (model / name).exists():
            (other_model / name).write_bytes((model / name).read_bytes())
    capsys.readouterr()
    for extra, changed in (
        (["--temperature", "0.7"], "temperature: 1.0 -> 0.7"),
        (["--seed", "1"], "seed: 0 -> 1"),
        (["--max-new-tokens", "7"], "max_new_tokens: 6 -> 7"),
    ):
        assert main(_argv(model, bench_file, out, *extra)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and changed in err and "use a new --out" in err and "Traceback" not in err
    assert main(_argv(other_model, bench_file, out)) == 2
    assert "model:" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert main(_argv(model, bench_file, out, "--k", "2")) == 0  # the same settings resume (nothing new to do)
    assert json.loads((out / CONFIG_FILE).read_text())["temperature"] == 1.0


def test_samples_without_a_recorded_config_are_refused(tiny_model, tmp_path, capsys):
    model, bench_file = tiny_model
    out = tmp_path / "eval"
    out.mkdir()
    (out / SAMPLES_FILE).write_text('{"benchmark": "kk", "problem_id": "0", "sample_index": 0}\n')
    assert main(_argv(model, bench_file, out)) == 2
    assert "unknown model and settings" in capsys.readouterr().err


def test_repeated_problem_ids_are_refused_with_file_and_line(tiny_model, tmp_path, capsys):
    model, _ = tiny_model
    rows = [{"prompt": f"q{i}", "label": "(1) A is a knight", "meta": {"id": "p1" if i in (1, 3) else f"x{i}"}} for i in range(4)]
    bench_file = tmp_path / "dup.jsonl"
    bench_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(_argv(model, bench_file, tmp_path / "eval")) == 2
    err = capsys.readouterr().err
    assert f"{bench_file}:4: problem id 'p1' of --bench kk repeats {bench_file}:2" in err and err.count("\n") == 1
    assert not (tmp_path / "eval").exists()


def test_an_interrupted_batch_reproduces_the_uninterrupted_samples(tiny_model, tmp_path):
    model, bench_file = tiny_model
    rows = [json.loads(line) for line in bench_file.read_text().splitlines()]
    gen = HFGenerator(str(model), EvalSampling(temperature=1.0, max_new_tokens=6, seed=3), batch_size=8)
    bench = get_benchmark("kk")
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    evaluate_benchmark(bench, rows, gen, k=2, out_path=whole, batch_problems=4, seed=3)
    evaluate_benchmark(bench, rows[1:3], gen, k=2, out_path=part, batch_problems=4, seed=3)  # a batch cut short ...
    lines = part.read_text().splitlines()
    part.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # ... and killed mid-write
    evaluate_benchmark(bench, rows, gen, k=2, out_path=part, batch_problems=4, seed=3)

    def samples(path):
        return {(r["problem_id"], r["sample_index"]): r["response"] for r in read_records(path)}

    assert samples(part) == samples(whole) and len(samples(whole)) == 8
    assert len({r for r in samples(whole).values()}) > 1  # real sampling, not one fixed text


def test_problem_seed_depends_on_seed_benchmark_and_id_only():
    assert problem_seed(0, "kk", "1") == problem_seed(0, "kk", "1")
    assert len({problem_seed(0, "kk", "1"), problem_seed(1, "kk", "1"), problem_seed(0, "aime24", "1"), problem_seed(0, "kk", "2")}) == 4
    assert 0 <= problem_seed(7, "kk", "x") < 2**63
