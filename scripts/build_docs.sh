#!/usr/bin/env bash
# The docs site, built strictly (mkdocs.yml: a broken link or anchor, or a page left out of the navigation, fails the
# build). Run in the docs venv (requirements/docs.txt: mkdocs and Material, pinned); CI creates it in .venv-docs.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements/docs.txt
python -m mkdocs build --strict --clean
