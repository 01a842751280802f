"""``python -m data_prep.math_eval ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/math_eval.py``
(installed from the wheel: ``adora-prep-math-eval``)."""

from adora_openrlhf.data_prep.math_eval import main

if __name__ == "__main__":
    raise SystemExit(main())
