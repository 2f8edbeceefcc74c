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
# SKIP_BENCH=1: the grid alone, the whole call (a run took 3.5 to 15 min with seven sharing the GPU in time slices,
# most of it fine-tuning). GRID_ORDER (method:seed ...), SLOTS, START_LEFT, MPS, REPRODUCE, FT_BENCH and FT_COMPILE
# shape the grid (step 4).
# Session 2026-12-04's call: SKIP_BENCH=1 MPS=1 REPRODUCE=none:2021 FT_BENCH=0 bash docs/device/gpu-bench.sh
# The next session (the kit built and slimmed, then `cp results/gpu-small/none-seq0-seed2021-3a222f3802.json .devkit/`):
#   call 1: SKIP_BENCH=1 MPS=1 SLOTS=15 REPRODUCE=.devkit/none-seq0-seed2021-3a222f3802.json GRID_ORDER="none:222
#   one:222 ncl:2021 kd:2021 ewc:2021 derpp:2021 das:2021 ncl:111 kd:111 ewc:111 derpp:111 das:111 ncl:222 kd:222"
#   bash docs/device/gpu-bench.sh: the committed record re-derived at once beside the grid (REPRODUCE takes a record's
#   path, or method:seed for a grid run's record), the fine-tuning bench, the two short rows, then continual runs;
#   call 2, at once (the machine stays warm 30 s and keeps /tmp/work): the same command with END set to the session's
#   time left, FT_BENCH=0 FT_COMPILE=<call 1's choice>, and without REPRODUCE where call 1 printed its verdict:
#   finished runs are skipped ("complete, kept"), cut-off ones resume from their last stage checkpoint
#   (rehearsed with DRY=1: a run cut at its second domain finished in the next invocation under the same run id).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor DAPBENCH_SHARED=$PWD/.devkit/shared
LOG=$OUT/log.txt
K=.devkit
W=/tmp/work   # raw outputs; packed into $OUT at the end
T0=$(date +%s)
END=${END:-555}
# the runs in the order they start (method:seed): the longest first for the seeds that start at once, the shortest
# first for the seed that starts as slots free up (a run cut off by the call's end leaves nothing)
GRID_ORDER=${GRID_ORDER:-$(for s in 2021 111 222; do for m in $([ $s = 222 ] && echo none one ncl kd ewc das derpp || echo derpp das kd ewc ncl one none); do echo -n "$m:$s "; done; done)}
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
[ -d $D/data ] || { mkdir -p $D && tar xJf $K/data.tar.xz -C $D || exit 4; }
[ "${SKIP_BENCH:-0}" = 1 ] || [ "${1:-all}" = reproduce ] || [ -f $M/rb/config.json ] || { mkdir -p $M && MODELS=${MODELS:-rb,gpt2s} python3 docs/device/make_models.py $M $K/tok >>$LOG 2>&1 || exit 4; }
stamp setup done
DATA="--data-root $D/data/continuallm-layout --general-heldout $D/data/general/heldout.txt"
GENERAL=$D/data/general/train.txt  # the general training text: `run` and `bench` take it as a setting, `reproduce` as a flag
INPUTS="$DATA --set general_corpus=$GENERAL"
# reproduce RECORD LOG THREADS: `dapbench reproduce` of a carried or just-written gpu-small record, bounded by the call
reproduce() { OMP_NUM_THREADS=$3 timeout -k 10 $(( $(left) - 25 )) python3 -m benchmark.cli reproduce $1 $DATA --general-corpus $GENERAL --output-dir $W/repro >$2 2>&1; }
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

if [ "${1:-all}" = reproduce ]; then
# A second, short call (issue #51, 2026-12-04): `dapbench reproduce` of a gpu-small record the grid made (carried as
# $2), alone on the GPU, then the compiled NCL step at one micro-batch of 248 with a trace while the call has time
wait
stamp "reproduce $2"
reproduce $2 $W/grid/reproduce.log 4
stamp "reproduce rc=$?"
find $W/repro -path "*results*" -name "*.json" -exec cp {} $OUT/ \;
tail -c 3000 $W/grid/reproduce.log >$OUT/reproduce-tail.txt
if [ $(left) -gt 100 ]; then
  mkdir -p $M && MODELS=rb python3 docs/device/make_models.py $M $K/tok >>$LOG 2>&1
  bench $(( $(left) - 10 )) s6-ncl-compiled-mb248 --model $M/rb --methods ncl --warmup $WU --steps $ST --set dap.compile=true --set dap.per_device_batch_size=$MB1 --trace $W/traces/s6
  tar cJf $OUT/bench.tar.xz -C $W bench traces >>$LOG 2>&1
fi
stamp all done
exit 0
fi
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

# 4: the gpu-small grid: one process per run, SLOTS of them sharing the GPU at a time (each is host-bound: one CPU
# core and a few GB of the GPU's memory), the queue in GRID_ORDER's order, a run started only while START_LEFT seconds
# remain (a run stopped by the call's end leaves nothing). With MPS=1 the runs share the GPU through CUDA's
# multi-process service (kernels of several processes at once, not time slices): tried, checked with one CUDA
# context, and stopped again if that fails. REPRODUCE=method:seed re-runs that run's record with `dapbench
# reproduce` as soon as it is written (the GPU reproduction check), in a slot of its own; REPRODUCE=PATH a carried
# record at once.
if [ "${MPS:-0}" = 1 ] && [ "${DRY:-0}" != 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d >>$LOG 2>&1  # fails harmlessly where this call's predecessor left the daemon running
  if timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" >>$LOG 2>&1 \
    && [ -n "$(echo get_server_list | nvidia-cuda-mps-control 2>>$LOG)" ]; then  # a client reached an MPS server
    stamp "MPS on"
  else
    echo quit | nvidia-cuda-mps-control >>$LOG 2>&1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    stamp "MPS failed: time slices"
  fi
fi
# The fine-tuning update, plain and through compiled blocks (`dapbench bench --finetune`, gpu-small's settings): the
# grid fine-tunes through compiled blocks when they are at least 1.2x as fast (FT_BENCH=0 skips it, FT_COMPILE=1 forces)
FTW=30; FTS=200; [ "${DRY:-0}" = 1 ] && { FTW=2; FTS=3; }
if [ "${FT_BENCH:-1}" = 1 ]; then
  stamp "finetune bench"
  timeout -k 10 180 python3 -m benchmark.cli bench --profile gpu-small $INPUTS $( [ "${DRY:-0}" = 1 ] && echo --device cpu ) \
    --finetune --warmup $FTW --steps $FTS --quiet --save $W/bench >>$LOG 2>&1
  SPEEDUP=$(python3 -c "import glob, json; print(json.load(open(glob.glob('$W/bench/*-finetune.json')[0]))['compiled_speedup'])" 2>>$LOG || echo 0)
  stamp "finetune bench: compiled blocks ${SPEEDUP}x the eager update"
  python3 -c "import sys; sys.exit(float('$SPEEDUP') < 1.2)" && FT_COMPILE=${FT_COMPILE:-1}
fi
[ "${FT_COMPILE:-0}" = 1 ] && { G="$G --set finetune.compile=true"; stamp "grid fine-tunes through compiled blocks"; }
[ "${DRY:-0}" = 1 ] || (while [ $(left) -gt 20 ]; do
  echo "$(( $(date +%s) - T0 ))s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)" >>$W/grid/gpu.txt
  sleep 10; done 2>&1) &
stamp "grid start ($(left)s left)"
SLOTS=${SLOTS:-14}; START_LEFT=${START_LEFT:-150}
one_run() {  # method seed: one gpu-small run, bounded by the call's end
  # one thread each, compile workers too (inductor would start one per core in every run)
  OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 timeout -k 10 $(( $(left) - 25 )) python3 -m benchmark.cli run --profile gpu-small $INPUTS \
    --methods $1 --seeds $2 --output-dir $W/grid --no-leaderboard \
    $G >$W/grid/$1-$2.log 2>&1
  local rc=$?
  echo "$(( $(date +%s) - T0 ))s $1 $2 rc=$rc" >>$W/grid/runs.txt
}
reproduce_run() {  # $REPRODUCE: a record's path (re-run at once) or method:seed (that grid run's record, once written)
  local record=$REPRODUCE
  if [ ! -f "$record" ]; then
    record=""
    while [ -z "$record" ] && [ $(left) -gt $START_LEFT ]; do
      sleep 5; record=$(find $W/grid/results -name "${REPRODUCE%%:*}-*-seed${REPRODUCE##*:}-*.json" 2>/dev/null | head -1)
    done
  fi
  [ -n "$record" ] || return
  stamp "reproduce $record"
  reproduce $record $W/grid/reproduce-$(basename $record .json).log 1
  stamp "reproduce rc=$?"
}
[ -n "${REPRODUCE:-}" ] && reproduce_run &
RUNNING=()
running() { local n=0 p; for p in "${RUNNING[@]}"; do kill -0 $p 2>/dev/null && n=$((n + 1)); done; echo $n; }
for run in $GRID_ORDER; do
  while [ $(running) -ge $SLOTS ]; do sleep 2; done
  [ $(left) -gt $START_LEFT ] || { stamp "not started: $run and after"; break; }
  one_run ${run/:/ } &
  RUNNING+=($!)
done
wait
stamp "grid end: $(find $W/grid/results -name "*.json" 2>/dev/null | wc -l) record(s)"
nvidia-smi --query-gpu=memory.used --format=csv >>$LOG 2>&1
tar cJf $OUT/bench.tar.xz -C $W bench $(cd $W && find traces -name '*.txt') >>$LOG 2>&1
tar cf - -C $W $(cd $W && find traces -name '*.json') 2>>$LOG | xz -T0 -3 >$OUT/traces.tar.xz 2>>$LOG
mkdir -p $W/grid/repro; find $W/repro -path "*results*" -name "*.json" -exec cp {} $W/grid/repro/ \; 2>/dev/null
tar cJf $OUT/grid.tar.xz -C $W/grid $(cd $W/grid && ls -d results repro *.log *.txt 2>/dev/null) >>$LOG 2>&1
stamp all done
ls -la $OUT >>$LOG
