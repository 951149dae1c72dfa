#!/usr/bin/env bash
# Installs magi2studio's Python layer into the active Python (a venv, or the image's).
# One script for the README, CI and the Dockerfile, so the recipe CI proves is the one
# users get. Every version here equals image/lock.yaml (tests/distribution/test_lock.py).
# Usage: image/install.sh [--target cpu|cuda|musa] [--dev] [--editable] [--drop-cuda-kernels]
#   cpu:  CPU torch, vLLM / vLLM-Omni without their CUDA-only dependency lists.
#         --drop-cuda-kernels (the cpu image) removes vLLM's compiled CUDA extensions (~0.6 GB):
#         they link libcudart, which the cpu target never has, so they can never load there.
#   cuda: on the vLLM 0.30.0 CUDA base: keeps its torch + vLLM, adds vLLM-Omni 0.30.0.
#   musa: on the Moore Threads base: keeps its torch_musa, MATE, vLLM-MUSA and vLLM-Omni
#         tree; adds torchada and imports it first in every Python process.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
target=cpu dev=0 editable=0 drop_cuda=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="${2:-}"; shift 2 ;;
    --dev) dev=1; shift ;;
    --editable) editable=1; shift ;;
    --drop-cuda-kernels) drop_cuda=1; shift ;;
    *) echo "install.sh: unknown option $1 (use --target cpu|cuda|musa, --dev, --editable, --drop-cuda-kernels)" >&2; exit 2 ;;
  esac
done
case "$target" in
  cpu|cuda|musa) ;;
  *) echo "install.sh: unknown target '$target' (use cpu, cuda or musa)" >&2; exit 2 ;;
esac
if [ "$drop_cuda" = 1 ] && [ "$target" != cpu ]; then
  echo "install.sh: --drop-cuda-kernels is for --target cpu only (cuda and musa need those kernels)" >&2; exit 2
fi
py="${PYTHON:-python3}"
pip() { "$py" -m pip "$@"; }
# MAGI2_PIP_REPORTS (the image build sets it): each install writes pip's JSON report there, the
# only record of the sha256 of every wheel that went in (image/sbom.py reads them).
reports=0
pip_install() {
  reports=$((reports + 1))
  pip install ${MAGI2_PIP_REPORTS:+--report "$MAGI2_PIP_REPORTS/$(printf %02d "$reports").json"} "$@"
}
[ -n "${MAGI2_PIP_REPORTS:-}" ] && mkdir -p "$MAGI2_PIP_REPORTS"
pip_install -q pip==26.3
upstream=(-r "$here/requirements-upstream.txt")
case "$target" in
  cpu)
    # MAGI2_TORCH_INDEX_URL (the image sets PyTorch's CPU index) keeps PyPI's CUDA build out.
    pip_install -q ${MAGI2_TORCH_INDEX_URL:+--index-url "$MAGI2_TORCH_INDEX_URL"} torch==2.13.0
    # Without their CUDA-only dependency lists; xgrammar likewise (it pulls triton).
    pip_install -q --no-deps vllm==0.30.0 vllm-omni==0.30.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.11 ;;
  cuda)
    # The base carries torch 2.13.0 and vLLM 0.30.0; the upstream pins only constrain.
    pip_install -q -c "$here/requirements-upstream.txt" vllm-omni==0.30.0
    upstream=() ;;
  musa)
    pip_install -q torchada==0.1.103
    upstream=()
    # torchada maps CUDA-style calls onto torch_musa only if it is imported before the rest
    # of the torch ecosystem (seed 3.2): a .pth line does that in every process, workers too.
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "import torchada" > "$site/00-magi2studio-torchada.pth" ;;
esac
reqs=("${upstream[@]}" -r "$here/requirements-app.txt")
[ "$dev" = 1 ] && reqs+=(-r "$here/requirements-test.txt")
pip_install -q -c "$here/requirements-upstream.txt" "${reqs[@]}"
if [ "$editable" = 1 ]; then pip_install -q --no-deps -e "$root"; else pip_install -q --no-deps "$root"; fi
if [ "$drop_cuda" = 1 ]; then
  vllm_dir="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm"
  mapfile -t cuda_kernels < <(find "$vllm_dir" -name '*.so' -exec grep -l 'libcudart\.so' {} +)
  [ "${#cuda_kernels[@]}" -gt 0 ] && rm -f "${cuda_kernels[@]}"
  # vLLM's RECORD still lists them: the SBOM names them, so the drift check expects them gone.
  if [ -n "${MAGI2_PIP_REPORTS:-}" ]; then
    printf '%s\n' "${cuda_kernels[@]#"$(dirname "$vllm_dir")/"}" | sort > "$MAGI2_PIP_REPORTS/dropped-files.txt"
  fi
  echo "install.sh: dropped ${#cuda_kernels[@]} CUDA extension modules of vLLM (they link libcudart)"
fi
"$py" -c "import magi2studio, vllm_omni.diffusion.models.magi2.sampler_magi2" 2>/dev/null \
  || { echo "install.sh: magi2studio or vLLM-Omni's MAGI-2 modules do not import" >&2; exit 1; }
echo "install.sh: magi2studio installed for target $target"
