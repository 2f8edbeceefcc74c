#!/bin/bash
# Issue #51's device check on a lent GPU: one call of the device tool, steps in priority order, each bounded by
# `timeout`, the whole call ending by $END seconds. Run from the repository root with the kit carried in .devkit/
# (built by docs/device/make_kit.sh; .git/info/exclude lists it):
#   .devkit/whl/            datasets, dill, multiprocess wheels (the device image lacks them)
#   .devkit/tok/            ../shared/models/roberta-tiny's tokenizer, model_max_length raised to 1024
#   .devkit/data.tar.xz     ../shared/data: the data release and the general corpus (train and held-out)
#   .devkit/shared/models/small   the small model in float16 (recipe:small-half builds the same files from it)
# Steps: the bench at roberta-base's shape (compiled NCL with a profiler trace; NCL and DAS compiled and
# checkpointed with traces; NCL at one micro-batch of 248), then the gpu-small grid, one process per run, several
# sharing the GPU, until $END. Everything comes back as at most 8 files under $OUT: log.txt, bench.tar.xz (reports
# and operator tables), traces.tar.xz (Chrome traces), grid.tar.xz (finished records, run logs).
# DRY=1: a CPU rehearsal at toy shapes (OUT: an empty folder): every step runs, with tiny budgets.
# SKIP_BENCH=1: the grid alone, the whole call (the next lent session's plan: with MPS=1; a run took 3.5 to 15 min
# with seven sharing the GPU in time slices, most of it fine-tuning); GRID_METHODS, GRID_SEEDS choose the runs.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor DAPBENCH_SHARED=$PWD/.devkit/shared
LOG=$OUT/log.txt
K=.devkit
W=/tmp/work   # raw outputs; packed into $OUT at the end
T0=$(date +%s)
END=${END:-555}
GRID_METHODS=${GRID_METHODS:-none,ncl,das,one,kd,ewc,derpp}
GRID_SEEDS=${GRID_SEEDS:-2021}
stamp() { echo "=== $(( $(date +%s) - T0 ))s $*" | tee -a $LOG; }
left() { echo $(( END - ($(date +%s) - T0) )); }
mkdir -p $W/bench $W/traces $W/grid
if [ "${DRY:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $K/whl/*.whl >>$LOG 2>&1 || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>$LOG 2>&1
  M=/tmp/m D=/tmp/d
else
  export SMALL=1
  M=$W/m D=$W/d
fi
python3 -c "import torch,transformers,datasets,accelerate,peft,pyarrow;print(torch.__version__,transformers.__version__,datasets.__version__,accelerate.__version__,peft.__version__,pyarrow.__version__)" >>$LOG 2>&1 || exit 5
[ -f $M/rb/config.json ] || { mkdir -p $D $M && tar xJf $K/data.tar.xz -C $D && MODELS=${MODELS:-rb,gpt2s} python3 docs/device/make_models.py $M $K/tok >>$LOG 2>&1 || exit 4; }
stamp setup done
DATA="--data-root $D/data/continuallm-layout --general-heldout $D/data/general/heldout.txt"
B="python3 -m benchmark.cli bench --profile paper $DATA --sequence restaurant,phone --quiet --set dap.mixed_precision=bf16 --set dap.per_device_batch_size=124"
WU=2; ST=4; MB1=248; PROBE=1000
G="--set dap.steps=150"
if [ "${DRY:-0}" = 1 ]; then
  B="$B --device cpu --set dap.batch_size=4 --set dap.per_device_batch_size=2 --set dap.mixed_precision=no "; WU=1; ST=1; MB1=4; PROBE=8
  G="--device cpu --set dap.steps=2 --set dap.heldout_chunks=4 --set finetune.epoch_scale=0.2 --set finetune.max_train_examples=32 --set finetune.max_test_examples=32 --sequence restaurant,acl --set dap.probe_chunks=8"
fi
bench() { local t=$1 name=$2; shift 2; stamp "$name start"; timeout -k 15 $t $B "$@" --save $W/bench/$name >>$LOG 2>&1; echo "rc=$?" | tee -a $LOG; stamp "$name end"; }

# The gpu-small base model, built on the CPU while the bench runs (every grid process then finds it cached).
[ "${1:-all}" = rerun ] || python3 -c "from benchmark.data.bases import build_recipe; build_recipe('recipe:small-half', '$W/grid/.dapbench')" >>$LOG 2>&1 &

if [ "${1:-all}" = rerun ]; then
# The second call of a session (issue #51, 2026-11-27): NCL at one micro-batch of 248 with the vocabulary-aligned
# head, then NCL and DAS compiled and checkpointed (the recompute's restore under transformers 5.17); no traces, no grid
bench 90 s4-ncl-compiled-mb248 --model $M/rb --methods ncl --warmup $WU --steps $ST --set dap.compile=true --set dap.per_device_batch_size=$MB1
cp -r $W/bench $OUT/ 2>/dev/null
bench $(( $(left) - 10 )) s5-compiled-checkpointed --model $M/rb --methods ncl,das --warmup $WU --steps $ST --set dap.compile=true --set dap.activation_checkpointing=true --set dap.probe_chunks=$PROBE
tar cJf $OUT/bench.tar.xz -C $W bench >>$LOG 2>&1
stamp all done
exit 0
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
# 1: the NCL target, compiled blocks at 2 x 124, against the eager plain transformers step in the same process
bench 130 s1-ncl-compiled --model $M/rb --methods ncl --warmup $WU --steps $ST --set dap.compile=true --trace $W/traces/s1
# 2: DAS's memory and bound, compiled and checkpointed, NCL beside it
# (importance and KL proxy over 1000 probe chunks, not 10000: the same probe batch and so the same peak, a tenth of
# the time; the bench does not time them)
bench 200 s2-compiled-checkpointed --model $M/rb --methods ncl,das --warmup $WU --steps $ST --set dap.compile=true --set dap.activation_checkpointing=true --set dap.probe_chunks=$PROBE --trace $W/traces/s2
# 3: NCL compiled at one micro-batch of 248 (no accumulation)
bench 75 s3-ncl-compiled-mb248 --model $M/rb --methods ncl --warmup $WU --steps $ST --set dap.compile=true --set dap.per_device_batch_size=$MB1
fi
wait

# 4: the gpu-small grid, every run its own process sharing the GPU, until the call's end. With MPS=1 the runs share
# the GPU through CUDA's multi-process service (kernels of several processes at once, not time slices): tried, checked
# with one CUDA context, and stopped again if that fails.
if [ "${MPS:-0}" = 1 ] && [ "${DRY:-0}" != 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d >>$LOG 2>&1 && timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" >>$LOG 2>&1; then
    stamp "MPS on"
  else
    echo quit | nvidia-cuda-mps-control >>$LOG 2>&1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    stamp "MPS failed: time slices"
  fi
fi
stamp "grid start ($(left)s left)"
RUNS=0
for seed in ${GRID_SEEDS//,/ }; do for method in ${GRID_METHODS//,/ }; do RUNS=$((RUNS + 1)); done; done
THREADS=$(( $(nproc) / RUNS )); [ $THREADS -lt 1 ] && THREADS=1
GRID_LIMIT=$(( $(left) - 25 ))
for seed in ${GRID_SEEDS//,/ }; do
  for method in ${GRID_METHODS//,/ }; do
    OMP_NUM_THREADS=$THREADS timeout -k 10 $GRID_LIMIT python3 -m benchmark.cli run --profile gpu-small $DATA \
      --set general_corpus=$D/data/general/train.txt --methods $method --seeds $seed --output-dir $W/grid --no-leaderboard \
      $G >$W/grid/$method-$seed.log 2>&1 &
  done
done
wait
stamp "grid end: $(find $W/grid/results -name "*.json" 2>/dev/null | wc -l) record(s)"
nvidia-smi --query-gpu=memory.used --format=csv >>$LOG 2>&1
tar cJf $OUT/bench.tar.xz -C $W bench $(cd $W && find traces -name '*.txt') >>$LOG 2>&1
tar cf - -C $W $(cd $W && find traces -name '*.json') | xz -T0 -3 >$OUT/traces.tar.xz 2>>$LOG
tar cJf $OUT/grid.tar.xz -C $W/grid $(cd $W/grid && ls -d results *.log 2>/dev/null) >>$LOG 2>&1
stamp all done
ls -la $OUT >>$LOG
