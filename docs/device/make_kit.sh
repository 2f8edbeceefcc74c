#!/bin/bash
# The kit docs/device/gpu-bench.sh reads on a lent GPU, and the trimmed working tree a device call sends.
# Run from the repository root, with ../shared beside it and the project's venv active:
#   bash docs/device/make_kit.sh build     # .devkit/ (about 57 MB): wheels, tokenizer, data, the small model in fp16
#   bash docs/device/make_kit.sh slim      # before a device call: results/ and docs/images/ (over 100 MB) untracked
#                                          # and ignored, so tracked files plus .devkit stay under the 64 MiB a call
#                                          # carries (the files stay on disk)
#   bash docs/device/make_kit.sh restore   # after the call: those folders tracked again, .git/info/exclude as it was
# A call then names .devkit in `carry` and runs `bash docs/device/gpu-bench.sh` (or `... rerun`).
set -eu
SHARED=${DAPBENCH_SHARED:-../shared}
EXCLUDE=.git/info/exclude
case "${1:-}" in
build)
  mkdir -p .devkit/whl .devkit/tok .devkit/shared/models/small "$(dirname $EXCLUDE)"
  grep -qx '/.devkit/' $EXCLUDE 2>/dev/null || echo '/.devkit/' >>$EXCLUDE
  # the device image's python is 3.12 and has pyarrow, fsspec and huggingface-hub, not these three
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .devkit/whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  python3 - "$SHARED" <<'EOF'
import shutil, sys
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

shared = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(f"{shared}/models/roberta-tiny")
tokenizer.model_max_length = 1024  # the roberta-base-shaped bench model reads 164 tokens
tokenizer.save_pretrained(".devkit/tok")
# recipe:small-half rounds the small model to float16: a float16 copy builds the same files in half the bytes
src, dst = f"{shared}/models/small", ".devkit/shared/models/small"
with safe_open(f"{src}/model.safetensors", "pt") as f:
    metadata = f.metadata()
weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(f"{src}/model.safetensors").items()}
save_file(weights, f"{dst}/model.safetensors", metadata=metadata)
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "pretraining.json"):
    shutil.copy(f"{src}/{name}", dst)
EOF
  tar cJf .devkit/data.tar.xz -C "$SHARED" data/continuallm-layout data/general/heldout.txt data/general/train.txt
  du -sh .devkit
  ;;
slim)
  git rm -r -q --cached results docs/images
  printf '/results/\n/docs/images/\n' >>$EXCLUDE
  git ls-files -z | xargs -0 du -cb | tail -1
  ;;
restore)
  git reset -q -- results docs/images  # only what slim took out of the index
  sed -i '/^\/results\/$/d;/^\/docs\/images\/$/d' $EXCLUDE
  git status --short
  ;;
*)
  echo "usage: bash docs/device/make_kit.sh build|slim|restore" >&2
  exit 2
  ;;
esac
