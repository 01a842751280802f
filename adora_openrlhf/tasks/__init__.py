"""Tasks: what a task declares (``task.py``: row sources, modality, generator, row checks, demonstrations, response
probes, benchmark subsets), the task registry (``registry.py``: what ``data.task`` names), the built-in tasks
(``builtin.py``, with the subset rules of the benchmarks read from files; their row checks in ``row_checks.py``),
the per-source lookups of demonstrations, probes and subsets on the task of a source (``behaviours.py``), and each
task's logic in one module (``kk.py``: K&K puzzles; ``geo_synth.py``: generated shape images).

The rewards are in ``rewards/`` (registry by source); ``data_prep/`` holds the command-line converters and
``evaluation/`` the evaluation command, both built on these modules (the modules below them never import them).
"""
