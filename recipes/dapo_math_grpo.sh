#!/usr/bin/env bash
# Baseline of dapo_math_adora.sh: dr_grpo with one round of 4 responses per prompt, ADORA off.
# Needs 8 GPUs. Data: see dapo_math_adora.sh.
#
# Data (data_prep outputs under $DATA_DIR): dapo_math/train.jsonl (train), math_eval/math500.jsonl (held-out).
# Environment and extra arguments: see recipes/_submit.sh. Dry run without a cluster:
#   DRY_RUN=1 bash recipes/dapo_math_grpo.sh
RECIPE="dapo-math-grpo"
TRAIN_FILE="dapo_math/train.jsonl"
EVAL_FILE="math_eval/math500.jsonl"
source "$(dirname "${BASH_SOURCE[0]}")/_submit.sh"
