"""The Hugging Face generation engine of the local backend, also used by ``evaluation/`` and ``bench/``.

Modules, one job each: ``model`` (tiny random-init Qwen2-style model, ``from_pretrained`` with checks, LoRA),
``model_source`` (where a model's files are and whether they are whole), ``tokenization`` (a byte-level BPE
tokenizer trained on the task corpus, loading a model's tokenizer), ``vlm`` (the processor of a
vision-language model), ``decoding`` (sampling numerics, the compact decoding loop), ``decode_step`` (the fast
one-token step of Qwen2-style models, checked against named transformers releases), ``kv_cache`` (a growing
KV cache), ``rollout`` (batched generation -> scored responses) and ``evaluate`` (held-out accuracy).
Nothing here imports a backend.
"""
