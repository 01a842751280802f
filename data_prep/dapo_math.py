"""``python -m data_prep.dapo_math ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/dapo_math.py``
(installed from the wheel: ``adora-prep-dapo-math``)."""

from adora_openrlhf.data_prep.dapo_math import main

if __name__ == "__main__":
    raise SystemExit(main())
