"""``python -m data_prep.geometry3k ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/geometry3k.py``
(installed from the wheel: ``adora-prep-geometry3k``)."""

from adora_openrlhf.data_prep.geometry3k import main

if __name__ == "__main__":
    raise SystemExit(main())
