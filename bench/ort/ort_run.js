#!/usr/bin/env node
// ONNX Runtime (CPU) reference timing for bench/host.sh.
//
//   node bench/ort/ort_run.js MODEL [--runs N] [--threads T] [--seed S]
//
// Loads MODEL (external data next to it) with all graph optimisations and T intra-op threads (default 2, one
// inter-op thread, sequential execution), feeds seeded pseudo-random inputs of the model's input shapes (floats
// ~N(0,1) via Box-Muller on a 32-bit LCG; integer inputs 0; symbolic dims are an error), runs once to warm up, then N
// times (default 5), and prints one JSON object on stdout:
//   {"runtime": "onnxruntime-node", "version": "1.30.0", "threads": 2, "runs": 5,
//    "median_s": 0.61, "min_s": 0.60, "times_s": [...]}
// Errors (missing module, unreadable model): one line "error: ..." on stderr and exit code 2.
'use strict';

function fail(msg) {
  process.stderr.write(`error: ${msg}\n`);
  process.exit(2);
}

const args = process.argv.slice(2);
let model = null, runs = 5, threads = 2, seed = 0;
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  const num = () => {
    const v = Number(args[++i]);
    if (!Number.isInteger(v) || v < 0) fail(`${a}: expected a non-negative integer, got '${args[i]}'`);
    return v;
  };
  if (a === '--runs') runs = Math.max(1, num());
  else if (a === '--threads') threads = Math.max(1, num());
  else if (a === '--seed') seed = num();
  else if (a.startsWith('--')) fail(`${a}: unknown option (--runs N, --threads T, --seed S)`);
  else if (model === null) model = a;
  else fail(`${a}: only one MODEL is accepted`);
}
if (model === null) fail('usage: ort_run.js MODEL [--runs N] [--threads T] [--seed S]');

let ort;
try {
  ort = require('onnxruntime-node');
} catch (e) {
  fail(`onnxruntime-node is not installed (cd bench/ort && ONNXRUNTIME_NODE_INSTALL=skip npm install): ${e.message}`);
}

/// 32-bit LCG (Numerical Recipes constants) -> uniform (0, 1).
function makeRng(s) {
  let state = (s >>> 0) || 1;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return (state + 0.5) / 4294967296;
  };
}

function randomTensor(meta, rng) {
  const name = meta.name;
  if (!meta.isTensor) fail(`input '${name}' is not a tensor`);
  const dims = meta.shape.map((d) => {
    if (typeof d !== 'number' || d < 0) fail(`input '${name}' has a symbolic dim '${d}'`);
    return d;
  });
  const n = dims.reduce((a, b) => a * b, 1);
  switch (meta.type) {
    case 'float32': {
      const data = new Float32Array(n);
      for (let i = 0; i < n; i += 2) {  // Box-Muller
        const r = Math.sqrt(-2 * Math.log(rng())), t = 2 * Math.PI * rng();
        data[i] = r * Math.cos(t);
        if (i + 1 < n) data[i + 1] = r * Math.sin(t);
      }
      return new ort.Tensor('float32', data, dims);
    }
    case 'int64': return new ort.Tensor('int64', new BigInt64Array(n), dims);
    case 'int32': return new ort.Tensor('int32', new Int32Array(n), dims);
    case 'bool': return new ort.Tensor('bool', new Uint8Array(n), dims);
    default: fail(`input '${name}': cannot generate ${meta.type} data`);
  }
}

async function main() {
  let session;
  try {
    session = await ort.InferenceSession.create(model, {
      executionProviders: ['cpu'],
      graphOptimizationLevel: 'all',
      intraOpNumThreads: threads,
      interOpNumThreads: 1,
      executionMode: 'sequential',
    });
  } catch (e) {
    fail(`${model}: ${e.message}`);
  }
  const rng = makeRng(seed);
  const feeds = {};
  for (const meta of session.inputMetadata) feeds[meta.name] = randomTensor(meta, rng);
  await session.run(feeds);  // warm-up
  const times = [];
  for (let i = 0; i < runs; ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const sorted = [...times].sort((a, b) => a - b);
  const out = {
    runtime: 'onnxruntime-node',
    version: ort.env.versions ? ort.env.versions.node : 'unknown',
    threads,
    runs,
    median_s: sorted[Math.floor(sorted.length / 2)],
    min_s: sorted[0],
    times_s: times,
  };
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => fail(e.message));
