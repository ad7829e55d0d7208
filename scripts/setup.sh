#!/usr/bin/env bash
# Set up Plan Explorer on a fresh machine: torch (CPU build, pinned), the package and its test
# dependencies (the extras named in EXTRAS, default "test").  Safe to run again; does nothing
# that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# A bare `torch` requirement would resolve a multi-GB CUDA build: install the pinned CPU wheel
# first when torch is missing, so the package's torch range is already satisfied.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0 (CPU build)"
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
# EXTRAS: the optional dependency groups to install (scripts/test.sh adds hf, so that the hf:NAME
# tests run instead of skipping).
EXTRAS="${EXTRAS:-test}"
CHECK="import explorer, dash, dash_cytoscape, dash_ag_grid, networkx, pytest, pymetis"
case ",$EXTRAS," in *,hf,*) CHECK="$CHECK, transformers" ;; esac
if ! "$PY" -c "$CHECK" >/dev/null 2>&1 || [ pyproject.toml -nt .setup-stamp ]; then
    echo "setup: installing plan-explorer and its dependencies (.[$EXTRAS])"
    "$PY" -m pip install --quiet -e ".[$EXTRAS]"
    touch .setup-stamp
fi
if [ "${WITH_BROWSER:-0}" = "1" ] && ! command -v chromedriver >/dev/null 2>&1; then
    echo "setup: installing chromium and chromium-driver for browser tests"
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# compile the placement simulator's kernel now (seconds, once): ahead of time into an extension
# module that a placement loads without numba, and into numba's cache for where it cannot
# be built, so that a user's placement of a large graph does not pay for either
"$PY" -c "from explorer.engine.placement import simkernel; simkernel.main()" || true
# and the layer-wise search's kernels (transfer tables at many devices, min-plus products,
# pipeline stage ranges); both go to a user cache directory that every $EXPLORER_HOME shares
"$PY" -c "from explorer.engine.layerwise import costmodel; costmodel.warm() and print('setup: layer-wise search kernels compiled')" || true
echo "setup: done"
