#!/usr/bin/env bash
# Set up everything, then show VGG-16's layer-wise plan on the paper's 4×P100 NVLink node.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m explorer search vgg16 --devices 4 --preset p100-nvlink-4 --compare "$@"
