#!/usr/bin/env bash
# Install the verl test environment into the active Python environment (a venv of its own, e.g. .venv-verl; CPU
# only): verl 0.9.1 with the transformers it accepts (< 5.11, below the main environment's 5.15), the package
# without its dependencies, and the test tools. The tests marked `verl` run in it
# (`python -m pytest -q -m verl tests/test_verl_integration.py`).
# Every pip step uses requirements/verl-constraints.txt: torch==2.13.0 (CPU) and transformers==5.10.4.
# A finished install leaves a stamp in the environment (the digest of this script, the requirement files and
# pyproject.toml): run again with nothing changed, it returns at once (.ci/run installs it while the main suite runs).
# --dry-run passes --dry-run to both pip steps, which then only resolve (scripts/check_installs.sh), with no stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=requirements/verl-constraints.txt
if [[ "${1:-}" == --dry-run ]]; then
    pip install --dry-run -c "$pins" -r requirements/verl-test.txt
    pip install --dry-run -c "$pins" --no-deps -e .
    exit 0
fi
stamp="$(python -c 'import sys; print(sys.prefix)')/.adora-verl-test-env"
digest=$(cat "$0" requirements/verl-*.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
    echo "install_verl_test_env: already installed in $(dirname "$stamp") (stamp $stamp)"
    exit 0
fi
rm -f "$stamp"
pip install -c "$pins" -r requirements/verl-test.txt
pip install -c "$pins" --no-deps -e .
echo "$digest" > "$stamp"
