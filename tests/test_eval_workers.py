"""Data-parallel decoding in forked processes (evaluation/workers.py): results in item order from every worker, progress
forwarded, a worker's exception or death raised in the caller; the transformers engine gives the same samples with
one process or several."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest
import torch

from adora_openrlhf.evaluation.workers import run_in_workers, worker_count

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the workers fork (Linux only)")


def _square_with_pid(items, progress):
    for _ in items:
        progress(1)
    return [(item * item, os.getpid(), torch.get_num_threads()) for item in items]


def test_results_come_back_in_item_order_from_several_processes():
    reports = []
    results = run_in_workers(_square_with_pid, list(range(7)), workers=3, progress=reports.append)
    assert [r[0] for r in results] == [i * i for i in range(7)]
    pids = {r[1] for r in results}
    assert len(pids) == 3 and os.getpid() not in pids  # items 0, 3, 6 / 1, 4 / 2, 5 each in a process of its own
    assert results[0][1] == results[3][1] == results[6][1]
    assert sum(reports) == 7 and all(r[2] == max(1, torch.get_num_threads() // 3) for r in results)


def test_one_worker_or_one_item_runs_here():
    assert {r[1] for r in run_in_workers(_square_with_pid, [1, 2, 3], workers=1)} == {os.getpid()}
    assert run_in_workers(_square_with_pid, [4], workers=4)[0][:2] == (16, os.getpid())
    assert run_in_workers(_square_with_pid, [], workers=2) == []


def _fails_on_three(items, progress):
    if 3 in items:
        raise KeyError("no three here")
    return items


def _dies_on_three(items, progress):
    if 3 in items:
        os._exit(3)
    return items


def _wrong_count(items, progress):
    return items[:-1]


def test_a_failing_or_dying_worker_is_raised_in_the_caller():
    with pytest.raises(RuntimeError, match="(?s)worker process failed.*KeyError: 'no three here'"):
        run_in_workers(_fails_on_three, list(range(6)), workers=2)
    with pytest.raises(RuntimeError, match=r"ended without its results \(exit code 3\)"):
        run_in_workers(_dies_on_three, list(range(6)), workers=2)
    with pytest.raises(RuntimeError, match="returned 2 results for 3 items"):
        run_in_workers(_wrong_count, list(range(6)), workers=2)


def test_worker_count():
    cpu = torch.device("cpu")
    assert worker_count(None, cpu) == torch.get_num_threads()
    assert worker_count(3, cpu) == 3
    assert worker_count(3, torch.device("cuda")) == 1  # never fork a process that drives a GPU
    with pytest.raises(ValueError, match="--workers: must be >= 1"):
        worker_count(0, cpu)
    with multiprocessing.get_context("fork").Pool(1) as pool:  # a pool's worker is daemonic: it may not fork workers
        assert pool.apply(worker_count, (3, cpu)) == 1


def test_the_transformers_engine_gives_the_same_samples_with_one_or_three_processes(tmp_path):
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
    from adora_openrlhf.evaluation.generation import EvalSampling, HFGenerator
    from adora_openrlhf.tasks.kk import generate_rows

    rows = generate_rows(5, [2, 3], seed=3)
    tokenizer = train_bpe_tokenizer([m["content"] for r in rows for m in r["prompt"]] * 2, 300)
    tiny = TinyModelConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    build_tiny_model(tiny, tokenizer, seed=0).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    for temperature, k in ((1.0, 3), (0.0, 1)):
        sampling = EvalSampling(temperature=temperature, max_new_tokens=12)
        runs = {}
        for workers in (1, 3):
            generator = HFGenerator(str(tmp_path), sampling, batch_size=4, workers=workers)
            assert generator.workers == workers
            reports = []
            runs[workers] = generator.generate(rows, k, seeds=[11, 12, 13, 14, 15], progress=reports.append)
            assert sum(reports) == len(rows) * k
        assert runs[1] == runs[3]
        if temperature > 0:
            assert len({c.text for problem in runs[1] for c in problem}) > 1
    assert HFGenerator(str(tmp_path), sampling, workers=3, numerics="exact").workers == 1  # exact: one process
