"""``python -m eval.run`` in a checkout: a thin entry point to ``adora_openrlhf.evaluation`` (installed: ``adora-eval``)."""
