"""Data-parallel decoding on a CPU: the problems of one generation call split over forked worker processes.

The local backend's tiny models make small matrix products; torch's threads split each product over the cores,
which pays a synchronisation per operation and, for a batch of one-token steps, gains little (on the 2-core
machine of ``bench/results/eval_speed/`` two threads gave about 1.4x over one). Independent problems parallelise
without that cost: :func:`run_in_workers` forks ``workers`` processes (the model's weights are shared copy-on-write),
gives each every ``workers``-th item, runs ``task(items, progress)`` there with ``torch threads / workers`` threads,
and returns the results in item order. Progress reports from the workers are forwarded to ``progress`` as they
arrive. A worker that raises re-raises in the caller with its traceback; one that dies is named with its exit
code; the others are then stopped.

Only where forking is safe and cheap (:func:`worker_count`): Linux, a model on the CPU (never after CUDA is
initialised), more than one torch thread. ``eval.run``'s ``--workers`` sets the count (``auto``: one worker per
torch thread).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import torch

Item = TypeVar("Item")
Progress = Callable[[int], None]


def worker_count(requested: int | None, device: torch.device) -> int:
    """How many processes decode: ``requested`` (None = one per torch thread), or 1 where forking is not used
    (not Linux, the model on an accelerator, CUDA initialised in this process, or this process a pool's worker)."""
    if requested is not None and requested < 1:
        raise ValueError(f"--workers: must be >= 1, got {requested}")
    if (
        sys.platform != "linux"
        or device.type != "cpu"
        or torch.cuda.is_initialized()
        or multiprocessing.current_process().daemon
    ):
        return 1  # a daemonic process (a multiprocessing pool's worker) may not start processes of its own
    return torch.get_num_threads() if requested is None else requested


def _worker(
    task: Callable[[list[Any], Progress], list[Any]], items: list[Any], threads: int, writer: Connection
) -> None:
    torch.set_num_threads(threads)
    try:
        writer.send(("done", task(items, lambda n: writer.send(("progress", n)))))
    except BaseException:  # noqa: BLE001 - everything goes back to the caller, which raises it
        writer.send(("error", traceback.format_exc()))
    finally:
        writer.close()


def run_in_workers(
    task: Callable[[list[Item], Progress], list[Any]],
    items: Sequence[Item],
    workers: int,
    progress: Progress | None = None,
) -> list[Any]:
    """``task(items[w::workers], progress)`` in ``workers`` forked processes; each task returns one result per item
    it got; the results come back in the order of ``items`` (module docstring). ``workers`` 1 (or a single item)
    runs ``task`` here."""
    report = progress or (lambda n: None)
    workers = min(workers, len(items))
    if workers <= 1:
        return list(task(list(items), report))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # a forked child must not use the tokenizers' thread pool
    context = multiprocessing.get_context("fork")
    threads = max(1, torch.get_num_threads() // workers)
    running: dict[Connection, tuple[Any, list[int]]] = {}
    results: list[Any] = [None] * len(items)
    try:
        for first in range(workers):
            shard = list(range(first, len(items), workers))
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker, args=(task, [items[i] for i in shard], threads, writer), daemon=True
            )
            process.start()
            writer.close()
            running[reader] = (process, shard)
        while running:
            for reader in wait(list(running)):
                process, shard = running[reader]
                try:
                    kind, payload = reader.recv()
                except EOFError:
                    process.join()
                    raise RuntimeError(
                        f"a decoding worker process ended without its results (exit code {process.exitcode})"
                    ) from None
                if kind == "progress":
                    report(payload)
                elif kind == "error":
                    raise RuntimeError(f"a decoding worker process failed:\n{payload}")
                else:
                    if len(payload) != len(shard):
                        raise RuntimeError(f"a decoding worker returned {len(payload)} results for {len(shard)} items")
                    for index, result in zip(shard, payload, strict=True):
                        results[index] = result
                    del running[reader]
                    process.join()
    finally:
        for process, _ in running.values():
            process.terminate()
            process.join()
    return results
