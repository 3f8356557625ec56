#!/usr/bin/env bash
# Installs every package a fresh Debian 12 machine lacks (idempotent), then configures and builds
# onnxpipe into .build/main.   Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config
      libonnx-dev libprotobuf-dev protobuf-compiler libabsl-dev libgtest-dev libgmock-dev
      nlohmann-json3-dev libopenblas-dev libarchive-dev zlib1g-dev
      clang libclang-rt-14-dev
      python3 python3-numpy python3-torch python3-onnx libonnx-testdata fortunes fortunes-min)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

[[ ${1:-} == --no-build ]] && exit 0
cmake -S . -B .build/main -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build .build/main -j "$(nproc)"
