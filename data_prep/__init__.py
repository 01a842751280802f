"""``python -m data_prep.NAME`` in a checkout: thin entry points to the converters of ``adora_openrlhf.data_prep``
(installed: ``adora-prep-NAME``)."""
