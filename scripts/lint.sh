#!/usr/bin/env bash
# Lint and format check of the whole tree with the settings of pyproject.toml ([tool.ruff]); ruff is pinned in
# requirements/test.txt. Exit status 0 only when both checks pass. Fix with `ruff check --fix .` / `ruff format .`.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
ruff check . || status=1
ruff format --check . || status=1
exit "${status}"
