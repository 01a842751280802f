"""``python -m eval.run ...`` in a checkout: the evaluation command of ``adora_openrlhf/evaluation/run.py``
(installed from the wheel: ``adora-eval``)."""

from adora_openrlhf.evaluation.run import main

if __name__ == "__main__":
    raise SystemExit(main())
