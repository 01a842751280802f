"""``python -m data_prep.geo_synth ...`` in a checkout: the converter of ``adora_openrlhf/data_prep/geo_synth.py``
(installed from the wheel: ``adora-prep-geo-synth``)."""

from adora_openrlhf.data_prep.geo_synth import main

if __name__ == "__main__":
    raise SystemExit(main())
