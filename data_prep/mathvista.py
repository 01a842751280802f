"""``python -m data_prep.mathvista ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/mathvista.py``
(installed from the wheel: ``adora-prep-mathvista``)."""

from adora_openrlhf.data_prep.mathvista import main

if __name__ == "__main__":
    raise SystemExit(main())
