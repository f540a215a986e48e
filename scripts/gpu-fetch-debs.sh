#!/usr/bin/env bash
# Run HERE (Debian 12), before a GPU session: downloads the Debian packages the build needs into
# .deps/debs (git-ignored), to be carried to the GPU machine, which reaches no registry. There,
# scripts/gpu-check.sh unpacks them into .deps/root (never into /).
#   bash scripts/gpu-fetch-debs.sh      then: run(command="bash scripts/gpu-check.sh", carry=[".deps"])
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download doctest-dev libbenchmark-dev libbenchmark1debian \
  libxxhash-dev libxxhash0 liburing-dev liburing2
ls -la
