"""Time-outs of the two process groups this package sets up in an OpenRLHF run, read from the environment.

- :data:`DEEPSPEED_TIMEOUT_ENV` (seconds): the DeepSpeed process group of each model's ranks (``deepspeed.init_distributed``
  in OpenRLHF's ``DeepspeedStrategy.setup_distributed``, answered by ``.actors.AdoraDeepspeedStrategy``). Unset:
  OpenRLHF 0.11.2's own :data:`DEEPSPEED_TIMEOUT`, 60 minutes (it passes the value itself, so DeepSpeed 0.19.6's
  default of 10 minutes and its ``DEEPSPEED_TIMEOUT`` variable never apply).
- :data:`WEIGHT_SYNC_TIMEOUT_ENV` (seconds): the gloo weight-sync group between the policy's rank 0 and the vLLM engines
  (``--vllm.sync_backend gloo``, :mod:`.cpu.weight_sync`). Unset: :data:`WEIGHT_SYNC_TIMEOUT`, 30 minutes.

The launcher hands every one of them that is set in its environment to the Ray workers (:func:`timeout_env_vars`),
so one set where the run is launched reaches the workers of every node. docs/openrlhf_timeouts.md lists every
process group and wait of a run and says why a long sampling step trips none of them.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Mapping

from adora_openrlhf.errors import ConfigError

DEEPSPEED_TIMEOUT_ENV = "ADORA_DEEPSPEED_TIMEOUT_S"
WEIGHT_SYNC_TIMEOUT_ENV = "ADORA_WEIGHT_SYNC_TIMEOUT_S"
DEEPSPEED_TIMEOUT = datetime.timedelta(minutes=60)  # OpenRLHF 0.11.2: DeepspeedStrategy.setup_distributed's default
WEIGHT_SYNC_TIMEOUT = datetime.timedelta(minutes=30)
TIMEOUT_ENVS = (DEEPSPEED_TIMEOUT_ENV, WEIGHT_SYNC_TIMEOUT_ENV)


def timeout_from_env(
    name: str, default: datetime.timedelta, environ: Mapping[str, str] | None = None
) -> datetime.timedelta:
    """The time-out in seconds that variable ``name`` sets, ``default`` where it is unset or empty; a value that is not a
    finite number of seconds > 0 raises :class:`~adora_openrlhf.errors.ConfigError` (a ``ValueError``) naming the
    variable."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{name}: expected a number of seconds > 0, got {raw!r}")
    return datetime.timedelta(seconds=seconds)


def deepspeed_timeout(environ: Mapping[str, str] | None = None) -> datetime.timedelta:
    return timeout_from_env(DEEPSPEED_TIMEOUT_ENV, DEEPSPEED_TIMEOUT, environ)


def weight_sync_timeout(environ: Mapping[str, str] | None = None) -> datetime.timedelta:
    return timeout_from_env(WEIGHT_SYNC_TIMEOUT_ENV, WEIGHT_SYNC_TIMEOUT, environ)


def timeout_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The time-out variables set in ``environ`` (the launcher's environment), checked, for the Ray workers' env."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in TIMEOUT_ENVS:
        if environ.get(name, "").strip():
            timeout_from_env(name, DEEPSPEED_TIMEOUT, environ)  # a bad value stops the launch here, not in a worker
            out[name] = environ[name].strip()
    return out
