#!/usr/bin/env bash
# Set up everything, then start the app on http://127.0.0.1:8050/ (VGG-16 on the paper's
# 4×P100 NVLink node with its optimal plan).  Extra arguments go to `explorer serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m explorer serve "$@"
