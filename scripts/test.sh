#!/usr/bin/env bash
# Runs the whole test suite (unit, gradient, conformance, CLI and fuzz-corpus replay) on .build/main.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d .build/main ]] || scripts/setup.sh
[[ -x .build/venv/bin/python3 ]] || scripts/setup.sh --no-build  # onnxruntime for the --save checks
cmake --build .build/main -j "$(nproc)"
ctest --test-dir .build/main --output-on-failure -j "$(nproc)" --timeout 900
