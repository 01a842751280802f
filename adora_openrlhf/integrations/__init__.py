"""Drop-ins for other RL libraries, each calling the engine-free core (``adora_openrlhf.algorithms``).

- :mod:`adora_openrlhf.integrations.trl`: ``AdoraGRPOTrainer`` / ``AdoraGRPOConfig``, subclasses of TRL's
  ``GRPOTrainer`` / ``GRPOConfig`` (``pip install adora_openrlhf[trl]``);
- :mod:`adora_openrlhf.integrations.verl`: ADORA as advantage estimators registered with verl's
  ``register_adv_est`` (verl is installed separately, see docs/integrations.md).

Nothing here is imported by the rest of the package, and importing this package imports neither library: each
module imports its library when it is itself imported (TRL) or when its estimators are registered (verl).
"""
