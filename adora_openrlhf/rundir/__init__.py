"""A run's output directory, shared by both backends, ``evaluation/`` and ``bench/``.

Modules, one job each: ``lock`` (one process per directory), ``checks`` (the run directory's lock, what a new
run, ``--resume`` and ``--overwrite`` may find there, config comparison), ``checkpoints`` (the local backend's
atomic checkpoints with their manifest), ``metrics`` (``metrics.jsonl``, TensorBoard, wandb, the reward-curve
PNG) and ``heldout`` (the held-out rows and settings a run saves for ``eval.run --run``).
"""
