#!/usr/bin/env bash
# The device files of the testdata plans, hashed: one line per written file, "<sha256>  <plan>/<file>".
# Refactors that must not change behaviour (issue 32) compare this listing from a binary built before the change
# with one built after:  bench/device_files.sh OLD_BIN > before.txt; bench/device_files.sh build/bin/gspmd-onnx > after.txt
# Usage: bench/device_files.sh GSPMD_ONNX [CNN_DIR]   (CNN_DIR: a folder with resnet18.onnx from the e2e tests' export)
set -euo pipefail
bin=$(realpath "$1")
cnn=${2:-$(ls -d build/e2e-scratch/cnn-export/resnet18-* 2>/dev/null | head -1)}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d /tmp/device_files.XXXX)
trap 'rm -rf "$out"' EXIT
cd "$root"
n=0
plan() {  # NAME MODEL ARGS...
  local name=$1 model=$2
  shift 2
  local rc=0
  "$bin" partition "$model" -o "$out/$name" "$@" > "$out/$name.log" 2>&1 || rc=$?
  # The report (paths made relative) and the exit code are behaviour too; a refused plan writes no folder.
  echo "exit $rc" >> "$out/$name.log"
  sed -i -e "s|$out/||g" -e 's/plans in [0-9.]* ms/plans in - ms/' "$out/$name.log"
  if [[ -f "$out/$name/report.json" ]]; then  # wall-clock times vary from run to run
    python3 -c 'import json, sys
def strip(v):
    if isinstance(v, dict): return {k: strip(x) for k, x in v.items() if k not in ("compile_time_s", "search_time_s")}
    if isinstance(v, list): return [strip(x) for x in v]
    return v
p = sys.argv[1]; r = strip(json.load(open(p))); json.dump(r, open(p, "w"), indent=1, sort_keys=True)' "$out/$name/report.json"
  fi
  (cd "$out" && { find "$name" "$name.annotated.onnx" -type f 2>/dev/null || true; echo "$name.log"; } | sort | xargs sha256sum)
  n=$((n + 1))
}
for p in dp megatron 2d paper2d pipeline pipeline3d; do
  plan gpt.$p testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.$p.sharding.json
done
plan gpt.megatron.adam testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.megatron.sharding.json \
  --training --loss mean --optimizer adam
plan gpt.2d.remat testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.2d.sharding.json --training --loss mean --remat full
plan gpt.megatron.acc2 testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.megatron.sharding.json \
  --training --loss mean --accumulate 2
plan gpt.pipeline.circular testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.pipeline.sharding.json \
  --pipeline stage --schedule circular --training --loss mean
plan gpt.auto testdata/gpt/gpt_opset17.onnx --mesh 2x2 --auto
plan gpt.megatron.ort testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.megatron.sharding.json --collectives ort
plan gpt.2d.ort testdata/gpt/gpt_opset17.onnx --shardings testdata/gpt/gpt.2d.sharding.json --collectives ort \
  --annotated-model "$out/gpt.2d.ort.annotated.onnx"
plan llama.dp2tp2.ort testdata/llama/model.onnx --shardings testdata/llama/dp2tp2.plan.json --collectives ort
for p in megatron pipeline; do
  plan bert.$p testdata/bert/bert_opset17.onnx --shardings testdata/bert/bert.$p.sharding.json
done
for p in tp2 tp4 dp2tp2; do plan llama.$p testdata/llama/model.onnx --shardings testdata/llama/$p.plan.json; done
for p in dp2 row2; do plan dd.$p testdata/data_dependent/model.onnx --shardings testdata/data_dependent/$p.plan.json; done
for p in rows2 rows2cols2; do plan dyn_cnn.$p testdata/cnn/dyn_cnn/model.onnx --shardings testdata/cnn/dyn_cnn/$p.plan.json; done
for f in testdata/frontend/*/*.plan.json; do
  d=$(dirname "$f")
  plan "fe.$(basename "$d").$(basename "$f" .plan.json)" "$d.onnx" --shardings "$f"
done
plan fe.if_sharded testdata/frontend/if_sharded.onnx --shardings testdata/frontend/if_sharded.sharding.json
if [[ -n "$cnn" && -f "$cnn/resnet18.onnx" ]]; then
  for p in data spatial channel uneven uneven_spatial; do
    plan resnet18.$p "$cnn/resnet18.onnx" --shardings testdata/cnn/resnet18.$p.sharding.json
  done
  plan resnet18.data.training "$cnn/resnet18.onnx" --shardings testdata/cnn/resnet18.data.sharding.json --training --loss mean
fi
echo "# $n plans" >&2
