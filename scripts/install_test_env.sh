#!/usr/bin/env bash
# Install what the whole test suite needs into the active Python environment, CPU only: the package with
# its test tools, and openrlhf 0.11.2 importable without its GPU-only dependencies (vllm, flash-attn), so
# the OpenRLHF backend is tested against the real library. Every step uses the torch/transformers pins.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=requirements/constraints.txt
pip install -c "$pins" -r requirements/test.txt -e .
pip install -c "$pins" wheel==0.48.0
DS_BUILD_OPS=0 pip install --no-build-isolation -c "$pins" -r requirements/openrlhf-cpu-test.txt
pip install --no-deps -c "$pins" openrlhf==0.11.2
pip install -c "$pins" trl==1.16.0  # adora_openrlhf.integrations.trl (the [trl] extra); keeps the pinned torch and transformers
