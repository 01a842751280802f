#!/usr/bin/env bash
# Shared by the recipe scripts in this folder (each sets RECIPE, TRAIN_FILE, EVAL_FILE, then sources this
# file). Submits `python -m adora_openrlhf.train --backend openrlhf --recipe $RECIPE ...` as a Ray job.
#
# Environment:
#   RAY_ADDRESS    Ray dashboard of the head node (default http://127.0.0.1:8265)
#   DATA_DIR       data_prep outputs, on storage every node can read (default <repo>/data)
#   OUTPUT_DIR     checkpoints, TensorBoard logs and the final model, on shared storage
#                  (default <repo>/runs/$RECIPE)
#   MODEL          Hugging Face model name or local path (default: the recipe's model)
#   UPLOAD_REPO    1 (default): ship this checkout to the job as Ray's working_dir, so the driver and every
#                  Ray worker can import adora_openrlhf; 0: the package is already installed on every node
#   PY_MODULES     comma-separated local folders shipped to every node as Ray py_modules: a folder my_plugins/
#                  holding reward.py is then imported with --plugins my_plugins.reward
#   DRY_RUN=1      no Ray, no GPU: print the OpenRLHF command line, its resolved arguments and our config
#                  (the same checks as a real launch) and exit
#   PYTHON         interpreter for DRY_RUN (default python)
# Extra arguments are passed on: our flags (--adora.*, --sampling.*, --advantage.* ...) and any OpenRLHF
# flag (--vllm.num_engines 8, --actor.num_gpus_per_node 8 ...); later flags win.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_DIR="${DATA_DIR:-$REPO_DIR/data}"
OUTPUT_DIR="${OUTPUT_DIR:-$REPO_DIR/runs/$RECIPE}"
RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"

ARGS=(--backend openrlhf --recipe "$RECIPE" --output-dir "$OUTPUT_DIR"
      --data.train_path "$DATA_DIR/$TRAIN_FILE" --data.eval_path "$DATA_DIR/$EVAL_FILE")
if [[ -n "${MODEL:-}" ]]; then
  ARGS+=(--model "$MODEL")
fi

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  cd "$REPO_DIR"
  exec "${PYTHON:-python}" -m adora_openrlhf.train "${ARGS[@]}" --print-args "$@"
fi

# OpenRLHF's driver sets its own env_vars in ray.init(); Ray merges them with this job-level runtime env.
SUBMIT=(ray job submit --address "$RAY_ADDRESS")
RUNTIME_ENV="$("${PYTHON:-python}" - "$REPO_DIR" "${UPLOAD_REPO:-1}" "${PY_MODULES:-}" <<'PY'
import json, os, sys

repo, upload, modules = sys.argv[1], sys.argv[2] == "1", [m for m in sys.argv[3].split(",") if m]
env = {}
if upload:  # Ray also leaves out what .gitignore names (the venvs, runs, downloaded data)
    env.update(working_dir=repo, excludes=[".git", ".venv*", "runs", "data", "outputs", "*.safetensors", "*.pt"])
if modules:
    env["py_modules"] = [os.path.abspath(m) for m in modules]
print(json.dumps(env) if env else "")
PY
)"
if [[ -n "$RUNTIME_ENV" ]]; then
  SUBMIT+=(--runtime-env-json "$RUNTIME_ENV")
fi
exec "${SUBMIT[@]}" -- python -m adora_openrlhf.train "${ARGS[@]}" "$@"
