#!/usr/bin/env bash
# Wheels for a GPU machine that has Python 3.12, torch, torchvision, numpy, pillow, psutil,
# nvidia-ml-py and tqdm but no package index: what facebench needs besides, into .whl/.
# Run here (with pip and an index); carry .whl/ there; then, on that machine:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:. python3 bench/gpu_check.py
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pip_download() {
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
pip_download hydra-core==1.3.8 omegaconf==2.3.1 torchdata==0.11.0 webdataset==1.0.2 \
    braceexpand==0.1.7 PyYAML==6.0.3 packaging
# omegaconf's parser runtime exists only as a source archive: build its (pure Python) wheel.
python3 -m pip wheel --quiet --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -l .whl
