"""The embedded single-process backend: a plain torch optimiser around the generation engine
(``adora_openrlhf/engine``), CPU or one GPU; the run directory is ``adora_openrlhf/rundir``.

Modules, one job each: ``sft`` (supervised warm-up), ``allocate`` (the rollout allocator's adapter),
``rl_step`` (one RL step: sample, advantages, update), ``update`` (packing and the PPO-clip update) and
``trainer`` (the RL loop, top to bottom).
"""
