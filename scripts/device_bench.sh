#!/usr/bin/env bash
# Issue 49 item 5: BFT's cost on a borrowed GPU, one prepared script (tried on the CPU first with DEVICE=cpu).
#
# Runs, each with a time limit, in the repository root of the GPU machine ($OUT is the folder that comes back):
#   1. bench_layer.py (the layer alone and the end-to-end SASRec step; plus the trainer setting when
#      $BFTREC_DATA_ROOT holds Amazon Sports), every variant and bft_compiled, float32 (--amp off);
#   2. the same in bf16 autocast (--amp on);
#   3. tests/test_cuda.py (the CUDA paths: GRU4Rec, MaskDropout, fused Adam, compiled precision).
# Each writes its JSON or log into $OUT; the ratios to standard are measured within one run, on one card.
# Usage:  OUT=<folder> [DEVICE=cuda] [STEPS=30] [LIMIT_S=240] [WHEELS=1] bash scripts/device_bench.sh
# WHEELS=1 installs .whl/*.whl (hydra-core, omegaconf, antlr4-python3-runtime: the H200 image lacks them).
set -u
OUT=${OUT:?set OUT to the folder that comes back}
PY=${PY:-python3}; DEVICE=${DEVICE:-cuda}; STEPS=${STEPS:-30}; LIMIT_S=${LIMIT_S:-240}
ROOT=$(pwd); start=$(date +%s)
if [ "${WHEELS:-1}" = 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ROOT PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc
  $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } \
  | tee "$OUT/machine.txt"
variants=bft,bft_detach,bft_h,bft_h_detach,bft_compiled
only=both; [ -n "${BFTREC_DATA_ROOT:-}" ] && only=all
for amp in off on; do
  [ "$DEVICE" = cpu ] && [ $amp = on ] && continue  # bf16 autocast is a CUDA setting here
  timeout "$LIMIT_S" $PY scripts/bench_layer.py --device "$DEVICE" --amp $amp --steps "$STEPS" --warmup 5 \
    --only $only --variants $variants --note "scripts/device_bench.sh, amp $amp" \
    --out "$OUT/layer_${DEVICE}_amp-$amp.json" > "$OUT/layer_amp-$amp.log" 2>&1
  echo "bench_layer amp $amp rc=$? ($(tail -1 "$OUT/layer_amp-$amp.log"))"
done
if [ "$DEVICE" != cpu ]; then
  timeout "$LIMIT_S" $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda.py > "$OUT/cuda_tests.log" 2>&1
  echo "cuda tests rc=$? ($(tail -1 "$OUT/cuda_tests.log"))"
fi
echo "done in $(( $(date +%s) - start )) s"
