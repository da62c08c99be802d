#!/usr/bin/env bash
# Run cells of a grid (experiment=paper/main) on a borrowed GPU machine, with the code pinned at the
# commits the grid's other cells ran, and bring back what a cell leaves: its small files (metrics.json,
# ranks.csv.gz, history.csv, train.log, ...) and, for a cell the deadline cut, its checkpoints, so that
# the same command resumes it elsewhere (bftrec.grid resumes a cell that holds last.pt).
#
# Prepared on the machine that sends the job (results/paper_main/README.md, "Cells run on a GPU"):
#   .gpu/<wt>     a sparse partial clone of the repository at the grid's commit (bftrec/, configs/; a real
#                 git checkout, so each cell's env.json records that commit and whether it was dirty)
#   .gpu/data     the data files the cells read (never committed: .git/info/exclude)
#   .whl          wheels the GPU image lacks (hydra-core, omegaconf, antlr4-python3-runtime,
#                 hydra-joblib-launcher); skipped with WHEELS=0
# Usage (in the repository root of the GPU machine; $OUT is the folder that comes back):
#   bash scripts/device_grid.sh DEADLINE_S "<wt>|<overrides>|<n_jobs>" ...
# Each spec is one Hydra multirun, all started at once:
#   cd .gpu/<wt> && python3 -m bftrec.train -m experiment=paper/main trainer.device=$DEVICE
#       trainer.num_threads=1 trainer.amp=false hydra.launcher.n_jobs=<n_jobs> <overrides> out_root=$WORK
# trainer.amp=false: the grid's other cells ran in float32 on CPUs, so these do too (no bf16 autocast).
# At DEADLINE_S seconds after the start every job still running is stopped (its last.pt is whole: it is
# written atomically after each epoch), then $OUT gets cells.tgz (small files of every cell, the logs)
# and ckpt_<n>.tgz (last.pt + checkpoint.pt of each unfinished cell, most epochs first, while they fit
# the 64 MB that comes back). While it runs, `pytest -m gpu tests/test_cuda.py` checks this checkout's
# CUDA path (TESTS=0 skips it).
set -u
DEADLINE_S=${1:?usage: device_grid.sh DEADLINE_S SPEC...}; shift
OUT=${OUT:?set OUT to the folder that comes back}
PY=${PY:-python3}; DEVICE=${DEVICE:-cuda}; WORK=${WORK:-/tmp/pm}
ROOT=$(pwd); start=$(date +%s)
if [ "${WHEELS:-1}" = 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 BFTREC_DATA_ROOT=$ROOT/.gpu/data BFTREC_CACHE_DIR=/tmp/bftrec-cache
# the clones may belong to another user there: trust them for this job's git calls only (no global config)
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc; git --version 2>&1
  $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } \
  | tee "$OUT/machine.txt"

pids=(); i=0
for spec in "$@"; do
  IFS='|' read -r wt ov njobs <<< "$spec"
  # shellcheck disable=SC2086  # $ov holds several overrides
  (cd ".gpu/$wt" && exec setsid $PY -m bftrec.train -m experiment=paper/main trainer.device="$DEVICE" \
     trainer.num_threads=1 trainer.amp=false hydra.launcher.n_jobs="$njobs" $ov out_root="$WORK" \
     > "$WORK.grid$i.log" 2>&1) &
  pids+=($!); i=$((i + 1))
done
if [ "${TESTS:-1}" = 1 ]; then
  PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ROOT timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda.py > "$OUT/cuda_tests.log" 2>&1
  echo "cuda tests rc=$? ($(tail -1 "$OUT/cuda_tests.log"))"
fi
while :; do
  alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  [ $(( $(date +%s) - start )) -ge "$DEADLINE_S" ] && { echo "deadline: stopping the jobs still running"; break; }
  sleep 5
done
# each job leads its own process group (setsid): stop those groups only, never other users' processes
for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done; sleep 5
for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; sleep 1
cp "$WORK".*.log "$WORK/" 2>/dev/null
$PY "$ROOT/scripts/device_pack.py" "$WORK" "$OUT"
echo "done in $(( $(date +%s) - start )) s"
