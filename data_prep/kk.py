"""``python -m data_prep.kk ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/kk.py``
(installed from the wheel: ``adora-prep-kk``)."""

from adora_openrlhf.data_prep.kk import main

if __name__ == "__main__":
    raise SystemExit(main())
