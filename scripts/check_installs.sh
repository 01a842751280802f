#!/usr/bin/env bash
# Check that the documented install paths still resolve against the package index, without a GPU: each path runs
# pip's resolver with --dry-run in a fresh temporary venv (python3 -m venv, removed afterwards), as the path's own
# script or documented command does it. .ci/run runs it beside the test suite. One line per path: its status and
# its time; a failed path prints the tail of its pip output, and the script exits non-zero if any path failed.
#
#   gpu   bash scripts/install_gpu.sh --dry-run: torch (the pin; here the CPU wheel) and flash-attn's build tools
#         installed, then flash-attn 2.8.3 (its setup.py run for its metadata, with no CUDA build), the cluster
#         requirements (openrlhf[vllm]==0.11.2, vllm, deepspeed, ray) and the package resolved
#   trl   pip install --dry-run -c requirements/constraints.txt '.[trl]'      (docs/integrations.md)
#   verl  bash scripts/install_verl_test_env.sh --dry-run                    (docs/integrations.md, .ci/run)
#   cuda-wheels (not run by default; about 4 GB of downloads where the index serves no PEP 658 metadata): PyPI's CUDA
#         torch 2.13.0 with vllm 0.29.0, ray and transformers, resolved for Linux x86_64 and this Python, wheels only
#         (flash-attn, deepspeed and openrlhf, source packages, left out), ignoring pip's configuration files and
#         PIP_FIND_LINKS (a machine's local CPU torch): the CUDA torch's own pins (triton, nvidia-*-cu13) against vllm's
#
#   bash scripts/check_installs.sh              # gpu, trl and verl, one after the other
#   bash scripts/check_installs.sh gpu trl      # some of them
#
# What it does not prove: a dry run installs nothing, so nothing is imported or run, no CUDA kernel of flash-attn
# is compiled (FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE), and where the index offers a CPU build of torch 2.13.0 (the
# CI machines' local wheel) the CUDA build's own dependencies (nvidia-*) are not part of the resolution.
# pip reads each candidate's metadata from the index; where the index serves no separate metadata files (PEP 658),
# as the CI machines' does, pip downloads whole wheels to read it (about 1.9 GB for the gpu path, CPU torch aside)
# into a temporary directory, not into the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
paths=("$@")
(( ${#paths[@]} )) || paths=(gpu trl verl)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/adora-check-installs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

run_path() {  # the path's commands, in the active venv, from the repository root
    case "$1" in
        gpu) bash scripts/install_gpu.sh --dry-run ;;
        trl) pip install --dry-run -c requirements/constraints.txt '.[trl]' ;;
        verl) bash scripts/install_verl_test_env.sh --dry-run ;;
        cuda-wheels)
            local platforms=() v
            for v in $(seq 5 39); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
            platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
            env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null pip install --dry-run --ignore-installed --only-binary=:all: \
                "${platforms[@]}" --implementation cp --target "$tmp/cuda-wheels-target" \
                -c requirements/constraints.txt torch vllm==0.29.0 'ray[default]==2.55.0' transformers==5.15.0 ;;
        *) echo "check_installs: unknown path '$1' (gpu, trl, verl, cuda-wheels)" >&2; return 2 ;;
    esac
}

status=0
for path in "${paths[@]}"; do
    start=$(date +%s)
    log="$tmp/$path.log"
    rc=0
    ("$python" -m venv "$tmp/$path" && . "$tmp/$path/bin/activate" && cd "$root" && run_path "$path") > "$log" 2>&1 || rc=$?
    seconds=$(( $(date +%s) - start ))
    # the main packages of the resolution, from pip's "Would install" lines (and the gpu path's installed torch)
    resolved=$(grep -E '^(Would install|Successfully installed)' "$log" | tr ' ' '\n' \
        | grep -E '^(torch|triton|flash_attn|vllm|openrlhf|deepspeed|ray|transformers|trl|verl|adora_openrlhf|cuda-toolkit)-[0-9]' \
        | sort -u | tr '\n' ' ' || true)
    if (( rc == 0 )); then
        echo "check_installs: ${path}: resolved in ${seconds} s: ${resolved}"
    else
        echo "check_installs: ${path}: FAILED (status ${rc}) after ${seconds} s; the end of its pip output:"
        tail -n 30 "$log" | sed "s/^/    ${path}| /"
        status=1
    fi
    rm -rf "${tmp:?}/$path"
done
exit "${status}"
