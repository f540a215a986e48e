#!/usr/bin/env bash
# Run HERE (Debian 12), before a GPU session: downloads the Debian packages the build needs into
# .deps/debs and the pure-Python wheels the head-to-head needs (transformers and what it imports,
# never torch) into .deps/wheels (both git-ignored), to be carried to the GPU machine, which
# reaches no registry. There, scripts/gpu-check.sh unpacks them into .deps/root and .deps/py
# (never into / or the machine's site-packages).
#   called by scripts/gpu-prepare.sh, which also builds the wheel and the CUDA tests
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download doctest-dev libbenchmark-dev libbenchmark1debian \
  libxxhash-dev libxxhash0 liburing-dev liburing2
ls -la
cd ../..
# transformers' own dependencies, for the GPU machine's Python (CPython $GPU_PYTHON, x86_64,
# manylinux; binary wheels built for this machine's Python would not import there); torch, numpy
# and the like are already there. huggingface_hub stays below 2: 2.x needs httpx2, which the GPU
# image lacks (1.x uses its httpx). transformers >= 5 has activation_checkpointing_enable(
# offload=True), which bench/python/longest_sequence.py measures. The carry limit is 64 MiB in
# all, the work tree included.
GPU_PYTHON=${GPU_PYTHON:-3.12}
python3 -m pip download -q -d .deps/wheels --only-binary=:all: --no-deps \
  --python-version "$GPU_PYTHON" --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "transformers==5.23.0" \
  tokenizers safetensors "huggingface_hub<2" hf-xet regex pyyaml tqdm filelock packaging fsspec \
  typing-extensions requests urllib3 idna certifi charset-normalizer 2>&1 |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }
du -sh .deps
