#!/usr/bin/env bash
# The kk-testbed RL phase (40 GRPO steps, 16 prompts x 8 responses, lr 1.5e-4) on the openrlhf backend, from a
# kk-testbed warm start: one vLLM engine and one DeepSpeed actor (one GPU). On a machine without a GPU run the
# same command without Ray's job submission:
#   python -m adora_openrlhf.train --backend openrlhf --recipe kk-testbed-openrlhf --model WARM_START \
#       --data.train_path DATA/train.jsonl --data.eval_path DATA/test.jsonl
# Warm start and data for seed K (the local backend's warm-up, the testbed's generated puzzles as JSONL):
#   python -m adora_openrlhf.testbed_files --seeds K --out runs/cluster_testbed
#
# Data (under $DATA_DIR): kk-testbed/train.jsonl (train), kk-testbed/test.jsonl (held-out).
# Environment and extra arguments: see recipes/_submit.sh (MODEL is the warm start). Dry run without a cluster:
#   DRY_RUN=1 bash recipes/kk_testbed_openrlhf.sh
RECIPE="kk-testbed-openrlhf"
TRAIN_FILE="kk-testbed/train.jsonl"
EVAL_FILE="kk-testbed/test.jsonl"
source "$(dirname "${BASH_SOURCE[0]}")/_submit.sh"
