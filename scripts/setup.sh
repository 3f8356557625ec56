#!/usr/bin/env bash
# Installs every package a fresh Debian 12 machine lacks (idempotent), creates .build/venv (Debian's python3 with
# its torch/onnx/numpy plus onnxruntime from PyPI, for the tests that check saved models), then configures and
# builds onnxpipe into .build/main.   Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config
      libonnx-dev libprotobuf-dev protobuf-compiler libabsl-dev libgtest-dev libgmock-dev
      nlohmann-json3-dev libopenblas-dev libarchive-dev zlib1g-dev
      clang libclang-rt-14-dev
      python3 python3-venv python3-numpy python3-torch python3-onnx libonnx-testdata fortunes fortunes-min
      chromium graphviz python3-pil)
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

# onnxruntime is not in Debian 12: a venv that still sees Debian's packages (--system-site-packages).
ort_version=1.32.0
if ! .build/venv/bin/python3 -c "import onnxruntime, sys; sys.exit(onnxruntime.__version__ != '$ort_version')" \
    2>/dev/null; then
  echo "setup: installing onnxruntime $ort_version into .build/venv"
  mkdir -p .build
  /usr/bin/python3 -m venv --system-site-packages .build/venv
  .build/venv/bin/pip install -q --disable-pip-version-check "onnxruntime==$ort_version"
fi

# cuDNN frontend (header-only C++ over cuDNN's graph API; the CUDA backend's attention uses it): the pinned
# PyPI wheel's include/ is unpacked into .build/cudnn-frontend/ once, so builds need no network.
cudnn_fe_version=1.18.0
cudnn_fe_dir=.build/cudnn-frontend
if [[ $(cat "$cudnn_fe_dir/VERSION" 2>/dev/null) != "$cudnn_fe_version" ]]; then
  echo "setup: fetching cudnn-frontend $cudnn_fe_version headers into $cudnn_fe_dir"
  fe_tmp=$(mktemp -d)
  .build/venv/bin/pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$fe_tmp" "nvidia-cudnn-frontend==$cudnn_fe_version"
  .build/venv/bin/python3 -m zipfile -e "$fe_tmp"/nvidia_cudnn_frontend-*.whl "$fe_tmp/wheel"
  rm -rf "$cudnn_fe_dir"
  mkdir -p "$cudnn_fe_dir"
  mv "$fe_tmp/wheel/include" "$cudnn_fe_dir/include"
  echo "$cudnn_fe_version" >"$cudnn_fe_dir/VERSION"
  rm -rf "$fe_tmp"
fi

[[ ${1:-} == --no-build ]] && exit 0
cmake -S . -B .build/main -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build .build/main -j "$(nproc)"
