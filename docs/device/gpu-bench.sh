#!/bin/bash
# Issue #29's device check on a lent GPU: one call of the device tool, steps in priority order, each bounded by
# `timeout`; reports and the log land in $OUT. Run from the repository root with the kit carried in .devkit/:
#   .devkit/whl/        datasets, dill, multiprocess wheels (the device image lacks them; pip download --no-deps)
#   .devkit/tok/        ../shared/models/roberta-tiny's tokenizer files, model_max_length raised to 1024
#   .devkit/data.tar.xz ../shared/data without general/train.txt and the corpora and tasks the bench does not read
# `bash docs/device/gpu-bench.sh first` ran in the session's first call, `... second` in its second call (on the
# same warm machine, so the setup was skipped). DRY=1 SMALL=1: a CPU dry run at toy shapes (OUT: an empty folder).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
LOG=$OUT/log.txt
K=.devkit
T0=$(date +%s)
stamp() { echo "=== $(( $(date +%s) - T0 ))s $*" | tee -a $LOG; }
if [ "${DRY:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $K/whl/*.whl >>$LOG 2>&1 || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$LOG 2>&1
fi
python3 -c "import torch,transformers,datasets,accelerate,peft;print(torch.__version__,transformers.__version__,datasets.__version__,accelerate.__version__,peft.__version__)" >>$LOG 2>&1
[ -f /tmp/m/rb/config.json ] || { mkdir -p /tmp/d /tmp/m && tar xJf $K/data.tar.xz -C /tmp/d && python3 docs/device/make_models.py /tmp/m $K/tok >>$LOG 2>&1 || exit 4; }
stamp setup done
B="python3 -m benchmark.cli bench --profile paper --data-root /tmp/d/data/continuallm-layout --general-heldout /tmp/d/data/general/heldout.txt --sequence restaurant,phone --quiet --set dap.mixed_precision=bf16 --set dap.per_device_batch_size=124"
W1=3; S1=5; W=2; S=4
if [ "${DRY:-0}" = 1 ]; then
  B="$B --device cpu --set dap.batch_size=4 --set dap.per_device_batch_size=2 --set dap.mixed_precision=no --set dap.probe_chunks=8"; W1=1; S1=1; W=1; S=1
fi
step() { local t=$1 name=$2; shift 2; mkdir -p $OUT/$name; stamp "$name start"; timeout -k 15 $t $B "$@" --save $OUT/$name >>$LOG 2>&1; echo "rc=$?" | tee -a $LOG; stamp "$name end"; }
case "${1:-first}" in
first)
  # 1: the NCL target: compiled blocks, 2 x 124, against the eager plain transformers step in the same process
  step 190 s1-ncl-compiled --model /tmp/m/rb --methods ncl --warmup $W1 --steps $S1 --set dap.compile=true
  # 2: DAS's memory and bound with activation checkpointing (NCL beside it in the same process)
  step 130 s2-checkpointed --model /tmp/m/rb --methods ncl,das --warmup $W --steps $S --set dap.activation_checkpointing=true
  # 3: eager at 2 x 124: NCL and DAS (the micro-batch's effect without compile)
  step 120 s3-eager --model /tmp/m/rb --methods ncl,das --warmup $W --steps $S
  # 4: a GPT-2-small-shaped decoder, eager
  step 90 s4-decoder --model /tmp/m/gpt2s --methods ncl --warmup $W --steps $S
  ;;
second)
  step 170 t1-compiled --model /tmp/m/rb --methods ncl,das --warmup $W --steps $S --set dap.compile=true
  step 100 t2-compiled-248 --model /tmp/m/rb --methods ncl --warmup $W --steps $S --set dap.compile=true --set dap.per_device_batch_size=248
  ;;
esac
stamp all done
ls -la $OUT >>$LOG
