#!/usr/bin/env bash
# bench/host.sh: host speed of the executor (issue 5), as ratios measured in one run (this machine is noisy).
#
#   bash bench/host.sh [--runs N] [--keep DIR]
#
# Run from the repository root after building (build/bin/gspmd-onnx and build/bin/gspmd-bench-matmul). It
#   1. generates the 4-layer decoder (d_model 1024, d_ff 4096, 16 heads, batch 4, sequence 256: 107 GFLOP forward)
#      with testdata/tools/make_decoder.py into a scratch directory (removed at the end unless --keep DIR);
#   2. measures (a) oneDNN's raw float32 matmul GFLOP/s (gspmd-bench-matmul: 2048^3 and the decoder's shapes; the best
#      is the "peak"), then N times, interleaved: (b) `run --mesh 1`, (c) `run --mesh 4x4` with the Megatron + data
#      sharding (--check on the last repetition), (d) ONNX Runtime's CPU run of the same file (bench/ort/ort_run.js,
#      all graph optimisations, the same thread count), skipped with a message when node/npm or onnxruntime-node is
#      unavailable;
#   3. prints a markdown table of the medians and of the ratios.
# Wall times of gspmd-onnx are the report's host.wall_s (the emulated run: weight slicing, every node, output
# assembly; not model loading or partitioning); ONNX Runtime's are the median of session.run() after one warm-up.
# Threads: OMP_NUM_THREADS (default 2) for oneDNN and the executor, and ORT's intra-op threads.
set -euo pipefail

runs=3
keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    *) echo "error: $1: unknown option (--runs N, --keep DIR)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "error: --runs: expected a positive integer, got '$runs'" >&2; exit 2; }

root=$(pwd)
bin="$root/build/bin/gspmd-onnx"
mm="$root/build/bin/gspmd-bench-matmul"
py=/usr/bin/python3
for f in "$bin" "$mm"; do
  [[ -x "$f" ]] || { echo "error: $f: not built (cmake -S . -B build -G Ninja && ninja -C build)" >&2; exit 2; }
done
[[ -f testdata/tools/make_decoder.py ]] || { echo "error: run bench/host.sh from the repository root" >&2; exit 2; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

if [[ -n "$keep" ]]; then
  scratch="$keep"
  mkdir -p "$scratch"
else
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/gspmd-host.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
fi

echo "host.sh: $(nproc) CPUs, OMP_NUM_THREADS=$OMP_NUM_THREADS, $runs runs, scratch $scratch" >&2
"$py" testdata/tools/make_decoder.py --layers 4 --d-model 1024 --heads 16 --vocab 0 --batch 4 --seq 256 \
  --weights random --out "$scratch/dec4" --name dec4 --mesh 4x4 >&2
model="$scratch/dec4/dec4.onnx"

# ONNX Runtime: optional
ort=""
if command -v node >/dev/null 2>&1; then
  if [[ ! -d "$root/bench/ort/node_modules/onnxruntime-node" ]] && command -v npm >/dev/null 2>&1; then
    echo "host.sh: installing onnxruntime-node into bench/ort" >&2
    (cd "$root/bench/ort" && ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund >&2) || true
  fi
  if node -e "require('$root/bench/ort/node_modules/onnxruntime-node')" >/dev/null 2>&1; then
    ort="node $root/bench/ort/ort_run.js"
  fi
fi
[[ -n "$ort" ]] || echo "host.sh: ONNX Runtime row skipped (node, npm or onnxruntime-node unavailable)" >&2

echo "host.sh: (a) oneDNN raw matmul" >&2
"$mm" --runs 5 > "$scratch/matmul.jsonl"

for ((r = 1; r <= runs; r++)); do
  echo "host.sh: repetition $r/$runs" >&2
  "$bin" run "$model" --mesh 1 --report "$scratch/mesh1.$r.json" > /dev/null
  check=()
  [[ $r -eq $runs ]] && check=(--check)
  "$bin" run "$model" --mesh 4x4 --shardings "$scratch/dec4/dec4.megatron.sharding.json" "${check[@]}" \
    --report "$scratch/mesh4x4.$r.json" > /dev/null
  if [[ -n "$ort" ]]; then
    $ort "$model" --runs 3 --threads "$OMP_NUM_THREADS" > "$scratch/ort.$r.json"
  fi
done

"$py" - "$scratch" "$runs" "$OMP_NUM_THREADS" <<'EOF'
import json, statistics, sys, os
d, runs, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mm = [json.loads(l) for l in open(os.path.join(d, "matmul.jsonl")) if l.strip()]
peak = max(m["gflops"] for m in mm)
def rep(name):
    return [json.load(open(os.path.join(d, f"{name}.{r}.json"))) for r in range(1, runs + 1)]
m1, m16 = rep("mesh1"), rep("mesh4x4")
w1 = [x["host"]["wall_s"] for x in m1]
w16 = [x["host"]["wall_s"] for x in m16]
g1 = [x["host"]["gflops"] for x in m1]
g16 = [x["host"]["gflops"] for x in m16]
check = m16[-1].get("check", {})
ort = []
for r in range(1, runs + 1):
    p = os.path.join(d, f"ort.{r}.json")
    if os.path.exists(p):
        ort.append(json.load(open(p))["median_s"])
med = statistics.median
print(f"| measure (OMP_NUM_THREADS={threads}, median of {runs}) | value |")
print("|---|---|")
for m in mm:
    print(f"| oneDNN raw f32 matmul {m['m']}x{m['k']}x{m['n']} | {m['gflops']:.1f} GFLOP/s |")
print(f"| `run --mesh 1` host wall | {med(w1):.3f} s ({med(g1):.1f} GFLOP/s) |")
print(f"| `run --mesh 4x4` Megatron + data host wall | {med(w16):.3f} s ({med(g16):.1f} GFLOP/s), check "
      f"{'passed' if check.get('passed') else 'FAILED'} (max rel error {check.get('max_rel_error', float('nan')):.2e}) |")
if ort:
    print(f"| ONNX Runtime CPU session.run | {med(ort):.3f} s ({m1[0]['model_flops'] / med(ort) / 1e9:.1f} GFLOP/s) |")
else:
    print("| ONNX Runtime CPU session.run | skipped (not installed) |")
print()
print("| ratio | value | target |")
print("|---|---|---|")
print(f"| executor GFLOP/s (mesh 1) / oneDNN matmul peak | {med(g1) / peak:.2f} | |")
r16 = [a / b for a, b in zip(w16, w1)]
print(f"| mesh-4x4 wall / mesh-1 wall | {med(r16):.2f} | <= 1.3 |")
if ort:
    ro = [a / b for a, b in zip(w1, ort)]
    print(f"| gspmd mesh-1 wall / ORT wall | {med(ro):.2f} | <= 1.0 |")
else:
    print("| gspmd mesh-1 wall / ORT wall | skipped | <= 1.0 |")
EOF
