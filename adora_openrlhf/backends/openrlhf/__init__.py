"""The cluster backend: OpenRLHF 0.11.2 (Ray + vLLM + DeepSpeed) running our advantage path and sampler.

Modules (:mod:`.flags`, :mod:`.entry`, :mod:`.audit`, :mod:`.cpu_launch`, :mod:`.launcher` and :mod:`.rebind` import
without OpenRLHF's engines; the others need vLLM and DeepSpeed, GPU builds or vLLM's CPU build):

- :mod:`.flags`              RunConfig -> OpenRLHF command-line flags, checks, and the config carried to Ray
- :mod:`.entry`              OpenRLHF's own ``cli/train_ppo_ray.py``: its parser (read from its source) and its
                             ``train(args)`` driver run with our classes; the openrlhf version check
- :mod:`.launcher`           ``launch(cfg, passthrough, print_args, resume, overwrite)`` used by ``adora_openrlhf.train``
- :mod:`.cpu_launch`         the launcher's part of a run on a machine without a GPU
- :mod:`.rebind`             copies of OpenRLHF's functions with some global names answered differently
- :mod:`.cpu_device`         the CPU answers to OpenRLHF's ``torch.cuda`` calls, device mesh and barriers
- :mod:`.actors`             OpenRLHF's model actors, DeepSpeed strategy and replay buffer as this package runs them
- :mod:`.weight_sync`        the gloo weight sync and the vLLM engine actor that receives it
- :mod:`.flash_attn_standin` the ``flash_attn`` import answered on a CPU-only machine
- :mod:`.experience_maker`   :class:`AdoraExperienceMaker` (subclass of ``RemoteExperienceMaker``)
- :mod:`.samples_generator`  :class:`AdoraSamplesGenerator` (subclass of ``SamplesGenerator``)
- :mod:`.trainer`            :class:`AdoraPPOTrainer` (subclass of OpenRLHF's ``PPOTrainer``) and its Ray actor
- :mod:`.audit`              the pieces of OpenRLHF's source these depend on (re-audited by a test)
"""
