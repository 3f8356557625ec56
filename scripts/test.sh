#!/usr/bin/env bash
# Runs the whole test suite (unit, gradient, conformance, CLI and fuzz-corpus replay) on .build/main.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d .build/main ]] || scripts/setup.sh
cmake --build .build/main -j "$(nproc)"
ctest --test-dir .build/main --output-on-failure -j "$(nproc)" --timeout 900
