"""eval.run never mixes models or settings in one --out, refuses repeated problem ids, and reproduces an
interrupted batch's samples (each problem sampled under its own seed)."""

import json

import pytest

from adora_openrlhf.evaluation.benchmarks import get_benchmark
from adora_openrlhf.evaluation.checks import CONFIG_FILE
from adora_openrlhf.evaluation.generation import EvalSampling, HFGenerator
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, evaluate_benchmark, problem_seed, read_records
from adora_openrlhf.evaluation.run import main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random-init tiny model and tokenizer on disk (no training: samples are random text)."""
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
    from adora_openrlhf.tasks.kk import generate_rows

    root = tmp_path_factory.mktemp("model")
    rows = generate_rows(20, [2], seed=5)
    tok = train_bpe_tokenizer([m["content"] for r in rows for m in r["prompt"]] + [r["label"] for r in rows], 300)
    small = TinyModelConfig(
        vocab_size=300,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
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
    rows = [
        {"prompt": f"q{i}: A says ...", "label": "(1) A is a knight", "meta": {"id": "p1" if i in (1, 3) else f"x{i}"}}
        for i in range(4)
    ]
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
    assert (
        len(
            {
                problem_seed(0, "kk", "1"),
                problem_seed(1, "kk", "1"),
                problem_seed(0, "aime24", "1"),
                problem_seed(0, "kk", "2"),
            }
        )
        == 4
    )
    assert 0 <= problem_seed(7, "kk", "x") < 2**63


def test_samples_of_changed_rows_are_not_reused(tiny_model, tmp_path, caplog):
    """Samples are keyed by the problem's content too: a rerun with another --bench-file whose problem ids are the
    same (row positions) generates the changed problems again and scores only the current rows."""
    model, bench_file = tiny_model
    out = tmp_path / "eval"
    assert main(_argv(model, bench_file, out)) == 0
    rows = [json.loads(line) for line in bench_file.read_text().splitlines()]
    from adora_openrlhf.tasks.kk import generate_rows

    changed = tmp_path / "changed.jsonl"
    rows[1] = generate_rows(1, [2], seed=99)[0]  # another puzzle at position 1: same problem id "1"
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))  # and a shorter file
    with caplog.at_level("INFO", logger="adora_openrlhf.evaluation.loop"):
        assert main(_argv(model, changed, out)) == 0
    assert "ignoring 2 samples of problems whose prompt, label or images changed since" in caplog.text
    records = read_records(out / SAMPLES_FILE)
    assert len(records) == 4 * 2 + 2  # problem 1 generated again under its new content
    assert {r["label"] for r in records if r["problem_id"] == "1"} == {
        json.loads(line)["label"] for line in bench_file.read_text().splitlines()[1:2]
    } | {rows[1]["label"]}
    report = json.loads((out / "report.json").read_text())
    overall = next(r for r in report["rows"] if r["subset"] == "all")
    assert overall["problems"] == 3 and overall["samples"] == 6  # only the current three rows are scored
    current = {
        (r["problem_id"], r["problem_hash"]) for r in records if r["prompt"] in [row["prompt"] for row in rows[:3]]
    }
    assert len(current) == 3


def test_problem_hash_covers_prompt_label_meta_and_image_bytes(tmp_path):
    from adora_openrlhf.evaluation.loop import problem_hash

    row = {"prompt": "q", "label": "1", "source": "kk", "meta": {"names": ["A"]}}
    assert problem_hash(row) == problem_hash(dict(row)) and len(problem_hash(row)) == 16
    for change in ({"prompt": "q2"}, {"label": "2"}, {"meta": {"names": ["B"]}}, {"source": "math500"}):
        assert problem_hash({**row, **change}) != problem_hash(row)
    image = tmp_path / "a.png"
    image.write_bytes(b"one")
    with_image = problem_hash({**row, "images": [str(image)]})
    image.write_bytes(b"two")
    assert problem_hash({**row, "images": [str(image)]}) != with_image


def test_a_second_evaluation_into_the_same_out_is_refused(tiny_model, tmp_path, capsys):
    from adora_openrlhf.rundir.lock import DirLock

    model, bench_file = tiny_model
    out = tmp_path / "eval"
    with DirLock(out, "--out", "eval.run"):  # another evaluation holds --out
        assert main(_argv(model, bench_file, out)) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1
            and "--out:" in err
            and "in use by another process (pid" in err
            and "choose another --out" in err
        )
        assert not (out / SAMPLES_FILE).exists() and not (out / CONFIG_FILE).exists()
    assert main(_argv(model, bench_file, out)) == 0  # released when its holder ends


def test_the_lock_holds_across_processes(tiny_model, tmp_path, capsys):
    import subprocess
    import sys
    import time

    model, bench_file = tiny_model
    out = tmp_path / "eval"
    script = "\n".join(
        [
            "import pathlib, sys",
            "from adora_openrlhf.rundir.lock import DirLock",
            "with DirLock(pathlib.Path(sys.argv[1]), '--out', 'x'):",
            "    print('held', flush=True)",
            "    input()",
        ]
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(_argv(model, bench_file, out)) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.communicate("\n", timeout=30)
    deadline = time.time() + 10
    while holder.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert main(_argv(model, bench_file, out)) == 0


def _png(path, size=(8, 8)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, "red").save(path)
    return path


def test_a_missing_or_broken_image_fails_before_generation_naming_its_line(tiny_model, tmp_path, capsys):
    model, _ = tiny_model
    _png(tmp_path / "img" / "ok.png")
    broken = _png(tmp_path / "img" / "broken.png", (64, 64))
    broken.write_bytes(broken.read_bytes()[:60])  # a truncated PNG
    row = {
        "prompt": "<image>Which colour?",
        "label": "red",
        "source": "geo_synth",
        "meta": {"task": "colour", "difficulty": 1},
    }
    for images, message in (
        # read beside the file
        (
            ["img/missing.png"],
            f"field 'images[0]': no image file at {str(tmp_path / 'img' / 'missing.png')!r}",
        ),
        (["img/ok.png", str(broken)], "field 'images[1]':"),
    ):
        bench_file = tmp_path / "geo.jsonl"
        bench_file.write_text(
            json.dumps({**row, "images": ["img/ok.png"]}) + "\n\n" + json.dumps({**row, "images": images}) + "\n"
        )
        argv = [
            "--model",
            str(model),
            "--bench",
            "geo_synth",
            "--bench-file",
            f"geo_synth={bench_file}",
            "--k",
            "1",
            "--out",
            str(tmp_path / "e"),
        ]
        assert main([*argv, "--engine", "hf"]) == 2
        err = capsys.readouterr().err
        # line 3: file lines, the blank line 2 counted
        assert f"{bench_file}:3: {message}" in err and err.count("\n") == 1, err
        assert not (tmp_path / "e").exists()
    assert "is not a readable image" in main_error(model, tmp_path, row, [str(broken)], capsys)


def main_error(model, tmp_path, row, images, capsys):
    bench_file = tmp_path / "one.jsonl"
    bench_file.write_text(json.dumps({**row, "images": images}) + "\n")
    assert (
        main(
            [
                "--model",
                str(model),
                "--bench",
                "geo_synth",
                "--bench-file",
                f"geo_synth={bench_file}",
                "--out",
                str(tmp_path / "e1"),
            ]
        )
        == 2
    )
    return capsys.readouterr().err


def test_relative_image_paths_resolve_against_the_files_folder(tmp_path, monkeypatch):
    from adora_openrlhf.evaluation.benchmarks import get_benchmark, load_located_rows

    data = tmp_path / "data"
    _png(data / "img" / "a.png")
    _png(tmp_path / "cwd" / "img" / "b.png")  # beside the working directory, not beside the file
    monkeypatch.chdir(tmp_path / "cwd")
    rows = [
        {"prompt": "<image>q", "label": "red", "images": ["img/a.png"]},
        {"prompt": "<image>q", "label": "red", "images": ["img/b.png"]},
    ]
    (data / "geo.jsonl").write_text(json.dumps(rows[0]) + "\n")
    located = load_located_rows(get_benchmark("geo_synth"), str(data / "geo.jsonl"), None, 0, None, tmp_path / "cache")
    assert [row["images"] for _, row in located] == [[str((data / "img" / "a.png").resolve())]]
    (data / "geo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"geo.jsonl:2: field 'images\[0\]': no image file at '\S*/data/img/b.png'"):
        load_located_rows(get_benchmark("geo_synth"), str(data / "geo.jsonl"), None, 0, None, tmp_path / "cache")


def test_image_rows_for_a_text_model_and_a_foreign_tokenizer_fail_before_generation(tiny_model, tmp_path, capsys):
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
    from adora_openrlhf.tasks.kk import generate_rows

    model, bench_file = tiny_model
    _png(tmp_path / "a.png")
    geo = tmp_path / "geo.jsonl"
    geo.write_text(
        json.dumps({"prompt": "<image>Which colour?", "label": "red", "images": ["a.png"], "meta": {}}) + "\n"
    )
    argv = [
        "--model",
        str(model),
        "--bench",
        "geo_synth",
        "--bench-file",
        f"geo_synth={geo}",
        "--k",
        "1",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "e"),
    ]
    assert main(argv) == 2
    assert f"{geo}:1: field 'images': the model is text-only" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()
    # a tokenizer with more tokens than the model has embeddings (another model's tokenizer)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for name in ("config.json", "model.safetensors"):
        (foreign / name).write_bytes((model / name).read_bytes())
    corpus = [m["content"] for r in generate_rows(40, [3], seed=1) for m in r["prompt"]]
    train_bpe_tokenizer(corpus, 600).save_pretrained(str(foreign))
    assert main(_argv(foreign, bench_file, tmp_path / "e")) == 2
    err = capsys.readouterr().err
    assert f"{bench_file}:1: field 'prompt': encodes to token id" in err and "the model has 300 token embeddings" in err
    assert not (tmp_path / "e").exists()


def test_progress_is_reported_per_sample(tiny_model, tmp_path, monkeypatch):
    import adora_openrlhf.evaluation.loop as loop

    model, bench_file = tiny_model
    bars = []

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.unit, self.updates = total, 0, kwargs.get("unit"), []
            bars.append(self)

        def update(self, n):
            self.n += n
            self.updates.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(loop, "tqdm", Bar)
    rows = [json.loads(line) for line in bench_file.read_text().splitlines()]
    gen = HFGenerator(str(model), EvalSampling(temperature=1.0, max_new_tokens=6), batch_size=4)
    evaluate_benchmark(get_benchmark("kk"), rows, gen, k=2, out_path=tmp_path / "s.jsonl", batch_problems=4)
    (bar,) = bars
    assert bar.unit == "sample" and bar.total == 8 and bar.n == 8
    # one call of 8 samples in two decoding batches: reported as they end
    assert [n for n in bar.updates if n] == [
        4,
        4,
    ]
