#!/usr/bin/env bash
# Installs magi2studio's Python layer into the active Python (a venv, or the image's).
# One script for the README, CI and the Dockerfile, so the recipe CI proves is the one
# users get. Usage: image/install.sh [--target cpu|cuda|musa] [--dev] [--editable]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
target=cpu dev=0 editable=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift 2 ;;
    --dev) dev=1; shift ;;
    --editable) editable=1; shift ;;
    *) echo "install.sh: unknown option $1 (use --target cpu|cuda|musa, --dev, --editable)" >&2; exit 2 ;;
  esac
done
case "$target" in
  cpu) torch_spec="torch==2.13.0" ;;
  cuda|musa) torch_spec="" ;;  # the vLLM CUDA / vLLM-MUSA base image already carries its torch line
  *) echo "install.sh: unknown target '$target' (use cpu, cuda or musa)" >&2; exit 2 ;;
esac
pip() { python -m pip "$@"; }
pip install -q --upgrade pip
[ -n "$torch_spec" ] && pip install -q "$torch_spec"
# vLLM / vLLM-Omni without their CUDA-only dependency lists; xgrammar likewise (it pulls triton).
pip install -q --no-deps vllm==0.30.0 vllm-omni==0.30.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.11
reqs=(-r "$here/requirements-upstream.txt" -r "$here/requirements-app.txt")
[ "$dev" = 1 ] && reqs+=(-r "$here/requirements-test.txt")
pip install -q "${reqs[@]}"
if [ "$editable" = 1 ]; then pip install -q --no-deps -e "$root"; else pip install -q --no-deps "$root"; fi
python -c "import magi2studio, vllm_omni.diffusion.models.magi2.sampler_magi2" 2>/dev/null \
  || { echo "install.sh: magi2studio or vLLM-Omni's MAGI-2 modules do not import" >&2; exit 1; }
echo "install.sh: magi2studio installed for target $target"
