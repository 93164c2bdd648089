#!/bin/bash
# Benchmarks `--auto` (docs/auto.md) against the hand-written Megatron + data plan and data parallelism on shape-only
# GPT decoders (testdata/tools/make_decoder.py --weights absent) and resnet18, with `simulate`, and records the search
# time; then the paper-scale and GPT-on-GPUs comparisons (bench/auto_pod.py, bench/auto_gpus.py). Writes bench/auto.md
# (about 4 minutes). Usage: bash bench/auto.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/bin/gspmd-onnx
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/gspmd-auto-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=bench/auto.md

row() {  # name model mesh extra-auto-flags
  local name=$1 model=$2 mesh=$3 extra=${4:-}
  local dir; dir=$(dirname "$model"); local stem; stem=$(basename "$model" .onnx)
  # Data parallel: the batch dim of the input over both mesh axes.
  local input; input=$($PY -c "import onnx,sys; m=onnx.load('$model', load_external_data=False); print(m.graph.input[0].name, len(m.graph.input[0].type.tensor_type.shape.dim))")
  set -- $input
  $PY -c "import json; r=$2; json.dump({'mesh': {'axes': ['data','model']}, 'tensors': {'$1': [['data','model']] + [None]*(r-1)}}, open('$dir/$stem.dp.sharding.json','w'))"
  $BIN simulate "$model" --mesh "$mesh" --shardings "$dir/$stem.dp.sharding.json" --report "$WORK/dp.json" >/dev/null 2>&1 \
    || echo '{}' > "$WORK/dp.json"
  if [ -f "$dir/$stem.megatron.sharding.json" ]; then
    $BIN simulate "$model" --mesh "$mesh" --shardings "$dir/$stem.megatron.sharding.json" --report "$WORK/meg.json" >/dev/null
  else
    echo '{}' > "$WORK/meg.json"
  fi
  echo '{"tensors": {}}' > "$WORK/none.json"
  local t0; t0=$(date +%s.%N)
  $BIN simulate "$model" --mesh "$mesh" --shardings "$WORK/none.json" --auto $extra --report "$WORK/auto.json" > "$WORK/auto.txt"
  local t1; t1=$(date +%s.%N)
  $PY - "$name" "$mesh" "$WORK" "$t0" "$t1" "$extra" >> "$OUT" <<'PYEOF'
import json, sys
name, mesh, work, t0, t1, extra = sys.argv[1:]
def load(f):
    try:
        return json.load(open(f"{work}/{f}.json"))
    except Exception:
        return {}
def cell(r):
    if not r.get("simulated"):
        return "n/a"
    s = r["simulated"]
    mem = s["per_device"][0]["peak_memory_bytes"] / 2**30
    return f"{s['step_time_s']*1e3:.3f} ms / {mem:.2f} GiB"
a = load("auto")
au = a["auto"]
lim = au["memory_limit_bytes"] / 2**30
plan = ", ".join(f"{c['group']} {json.dumps(c['spec'])}" for c in au["choices"] if not c["free"])
print(f"| {name} | {mesh} | {cell(a)} | {cell(load('meg'))} | {cell(load('dp'))} | {lim:.2f} GiB | "
      f"{au['search_time_s']:.2f} s ({float(t1)-float(t0):.2f} s total) | {au['evaluations']} / {au['groups']} | {plan} |")
PYEOF
}

mk() {  # name flags mesh
  $PY testdata/tools/make_decoder.py $2 --weights absent --mesh "$3" --name "$1" --out "$WORK" >/dev/null
  echo "$WORK/$1.onnx"
}

{
  echo "# --auto benchmark"
  echo
  echo "\`bash bench/auto.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores, target tpu-v3 (16 GiB HBM per core)."
  echo "Cells: simulated step time / static peak memory per device. Search: the search's own time (and the whole"
  echo "\`simulate --auto\` command's wall time, model loading and the final pipeline included)."
  echo
  echo "| model | mesh | --auto | Megatron + data | data parallel | memory limit | search time | evaluations / decisions | chosen annotations |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$OUT"

D="--vocab 32000"
row "decoder 4L d1024 B64 S512" "$(mk d4_1024_4 "--layers 4 --d-model 1024 --heads 16 $D --batch 64 --seq 512" 4x4)" 4x4
row "decoder 4L d1024 B64 S512" "$(mk d4_1024_8 "--layers 4 --d-model 1024 --heads 16 $D --batch 64 --seq 512" 8x8)" 8x8
row "decoder 24L d1024 B64 S512" "$(mk d24_1024_4 "--layers 24 --d-model 1024 --heads 16 $D --batch 64 --seq 512" 4x4)" 4x4
row "decoder 24L d1024 B64 S512" "$(mk d24_1024_8 "--layers 24 --d-model 1024 --heads 16 $D --batch 64 --seq 512" 8x8)" 8x8
row "decoder 4L d4096 B128 S1024" "$(mk d4_4096_8 "--layers 4 --d-model 4096 --heads 32 $D --batch 128 --seq 1024" 8x8)" 8x8
row "decoder 24L d4096 B64 S1024" "$(mk d24_4096_4 "--layers 24 --d-model 4096 --heads 32 $D --batch 64 --seq 1024" 4x4)" 4x4
row "decoder 24L d4096 B64 S1024" "$(mk d24_4096_8 "--layers 24 --d-model 4096 --heads 32 $D --batch 64 --seq 1024" 8x8)" 8x8
MB="$(mk d24_4096_mb "--layers 24 --d-model 4096 --heads 32 $D --batch 64 --seq 1024" 4x4)"
row "decoder 24L d4096, limit 6 GiB" "$MB" 4x4 "--memory-limit 6442450944"

# resnet18 (torchvision, exported by testdata/cnn/export_cnn.py) when torch is available.
if $PY testdata/cnn/export_cnn.py --model resnet18 --out "$WORK/cnn" >/dev/null 2>&1; then
  cp "$WORK/cnn/resnet18.onnx" "$WORK/resnet18.onnx"
  row "resnet18 (export_cnn.py default size)" "$WORK/resnet18.onnx" 2x2
fi
echo >> "$OUT"
# The paper's scale (its dense LMs against its 2D plan) and GPT models of 1.3B to 175B over GPUs and TPU v4 (Alpa's
# settings among them) against the classical plans, both training steps given only the mesh (docs/auto.md, "Results").
{
  echo "## At the paper's scale (bench/auto_pod.py)"
  echo
  $PY bench/auto_pod.py --bin "$BIN"
  echo
  echo "## GPT models on GPUs and TPU v4 (bench/auto_gpus.py)"
  echo
  $PY bench/auto_gpus.py --bin "$BIN"
  echo
} >> "$OUT"
echo "Written $OUT" >&2
