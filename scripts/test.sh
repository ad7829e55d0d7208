#!/usr/bin/env bash
# Set up everything, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_BROWSER=1 EXTRAS="test,hf" bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
