#!/usr/bin/env bash
# Install the OpenRLHF backend's GPU-node environment (Linux, an NVIDIA driver for CUDA 13, Python 3.10-3.12) into
# the active Python environment. Every node of the Ray cluster (head and workers) needs the same one. The order matters:
# openrlhf[vllm]==0.11.2 (requirements/cluster.txt) depends on flash-attn==2.8.3, which PyPI has as an sdist only,
# and its setup.py imports torch. Installed as a dependency of the cluster requirements, pip would build it in an
# isolated build environment without torch and fail ("No module named 'torch'"). So torch comes first, then
# flash-attn's build tools, then flash-attn itself with --no-build-isolation (compiled against the installed torch),
# and only then the cluster requirements, which find flash-attn installed.
# Every pip step uses requirements/constraints.txt (torch==2.13.0, transformers==5.15.0); on Linux, PyPI's wheel of
# torch 2.13.0 is the CUDA build (its metadata requires cuda-toolkit 13.0.3 and nvidia-*-cu13 packages).
#
#   bash scripts/install_gpu.sh              # install
#   bash scripts/install_gpu.sh --dry-run    # or DRY_RUN=1: resolve steps 3-5 only (scripts/check_installs.sh)
#
# --dry-run installs steps 1 and 2 for real (torch and the build tools: flash-attn's metadata comes from its
# setup.py, which imports them; a real install starts with the same two steps) and passes --dry-run to steps 3-5,
# with FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE so that flash-attn's setup.py needs no CUDA toolkit: pip resolves the
# whole environment and installs nothing more. As step 3 installs nothing then, step 4 resolves flash-attn again and
# gets --no-build-isolation too (in a real install it finds flash-attn installed and keeps pip's build isolation).
# On a CPU machine step 1 installs the CPU torch of the pin where the index offers one (the CI machines' local
# wheel); the CUDA kernels of flash-attn are never compiled in a dry run.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=requirements/constraints.txt
dry=()               # steps 3-5
dry_no_isolation=()  # step 4
if [[ $# -gt 1 || ( $# -eq 1 && "$1" != --dry-run ) ]]; then
    echo "usage: bash scripts/install_gpu.sh [--dry-run]   (or DRY_RUN=1)" >&2
    exit 2
fi
if [[ "${1:-}" == --dry-run || "${DRY_RUN:-0}" == 1 ]]; then
    dry=(--dry-run)
    dry_no_isolation=(--no-build-isolation)
    export FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE
    echo "install_gpu: dry run: steps 1-2 install, steps 3-5 only resolve"
fi

# 1. torch, alone and first, at the pin of requirements/constraints.txt (vllm 0.29.0 pins the same torch==2.13.0)
pip install -c "$pins" torch
# 2. what flash-attn's setup.py imports when pip runs it without build isolation (wheel as scripts/install_test_env.sh)
pip install -c "$pins" wheel==0.48.0 setuptools ninja packaging psutil
# 3. flash-attn, the version openrlhf 0.11.2 pins, built against the torch of step 1 (a prebuilt wheel that its
#    setup.py finds for this torch and CUDA, otherwise a compile with nvcc; MAX_JOBS bounds the compile's memory)
pip install "${dry[@]}" --no-build-isolation -c "$pins" flash-attn==2.8.3
# 4. the algorithm core and the cluster stack: openrlhf[vllm]==0.11.2, vllm 0.29.0, deepspeed 0.19.6, ray 2.55.0
pip install "${dry[@]}" "${dry_no_isolation[@]}" -c "$pins" -r requirements/core.txt -r requirements/cluster.txt
# 5. the package itself (recipes/_submit.sh also ships the checkout to the job with Ray's working_dir)
pip install "${dry[@]}" -c "$pins" -e .
