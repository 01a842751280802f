"""The cluster backend: OpenRLHF 0.11.2 (Ray + vLLM + DeepSpeed) running our advantage path and sampler.

Three rooms. Beside the subclasses, ``compat/`` holds what couples the backend to OpenRLHF's source and
``cpu/`` what exists only to run without a GPU (``docs/openrlhf_backend.md`` has an upgrade checklist for each).
:mod:`.flags`, :mod:`.launcher`, ``compat/`` and ``cpu/launch.py`` import without OpenRLHF's engines; the others
need vLLM and DeepSpeed (GPU builds or vLLM's CPU build).

- :mod:`.flags`              RunConfig -> OpenRLHF command-line flags, checks, and the config carried to Ray
- :mod:`.field_flags`        the one table of our fields and OpenRLHF's flags
- :mod:`.launcher`           ``launch(cfg, passthrough, print_args, resume, overwrite)`` used by ``adora_openrlhf.train``
- :mod:`.actors`             OpenRLHF's model actors, DeepSpeed strategy and replay buffer as this package runs them
- :mod:`.experience_maker`   :class:`AdoraExperienceMaker` (subclass of ``RemoteExperienceMaker``)
- :mod:`.samples_generator`  :class:`AdoraSamplesGenerator` (subclass of ``SamplesGenerator``)
- :mod:`.trainer`            :class:`AdoraPPOTrainer` (subclass of OpenRLHF's ``PPOTrainer``) and its Ray actor
- ``compat/entry.py``        OpenRLHF's own ``cli/train_ppo_ray.py``: its parser (read from its source) and its
                             ``train(args)`` driver run with our classes; the openrlhf version check
- ``compat/rebind.py``       copies of OpenRLHF's functions with some global names answered differently
                             (the pieces of OpenRLHF's source these depend on: ``tests/fixtures/openrlhf/openrlhf_audit.py``)
- ``cpu/launch.py``          the launcher's part of a run on a machine without a GPU
- ``cpu/device.py``          the CPU answers to OpenRLHF's ``torch.cuda`` calls, device mesh and barriers
- ``cpu/weight_sync.py``     the gloo weight sync and the vLLM engine actor that receives it
- ``cpu/precision.py``       ``--ds.param_dtype fp32`` (OpenRLHF trains in bf16 or fp16)
- ``cpu/zero3_gathers.py``   ZeRO-3 gathers one parameter at a time on gloo (DeepSpeed's batched gathers race there)
- ``cpu/flash_attn_standin.py`` the ``flash_attn`` import answered on a CPU-only machine
"""
