#!/usr/bin/env bash
# Ablation of dapo_math_adora.sh: adaptive multi-round sampling (balance exit rule) alone, ADORA off.
# Needs 8 GPUs. Data: see dapo_math_adora.sh.
#
# Data (data_prep outputs under $DATA_DIR): dapo_math/train.jsonl (train), math_eval/math500.jsonl (held-out).
# Environment and extra arguments: see recipes/_submit.sh. Dry run without a cluster:
#   DRY_RUN=1 bash recipes/dapo_math_ada.sh
RECIPE="dapo-math-ada"
TRAIN_FILE="dapo_math/train.jsonl"
EVAL_FILE="math_eval/math500.jsonl"
source "$(dirname "${BASH_SOURCE[0]}")/_submit.sh"
