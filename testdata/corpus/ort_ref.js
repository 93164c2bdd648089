#!/usr/bin/env node
// ONNX Runtime (CPU) reference outputs for the corpus (testdata/corpus, issue 14).
//
//   node testdata/corpus/ort_ref.js MODEL INPUT_DIR OUTPUT_DIR [--threads T] [--no-opt]
//
// Reads INPUT_DIR/input_<i>.pb (serialized onnx.TensorProto, the ONNX backend test-data layout) and feeds them to
// MODEL's inputs: by the TensorProto's name when it names an input, else in order. Runs once and writes
// OUTPUT_DIR/output_<i>.pb, one per graph output, in graph-output order, each named after its output. Prints one JSON
// line {"runtime": "onnxruntime-node", "version": ..., "outputs": [{"name", "type", "dims"}], "run_s": ...}.
// onnxruntime-node comes from bench/ort (cd bench/ort && ONNXRUNTIME_NODE_INSTALL=skip npm install), or from
// NODE_PATH. Errors: one line "error: ..." on stderr, exit code 2 (ORT refusing the model included).
// --no-opt disables ORT's graph optimisations (basic fusions can change rounding a little).
'use strict';
const fs = require('fs');
const path = require('path');

function fail(msg) {
  process.stderr.write(`error: ${String(msg).split('\n')[0]}\n`);
  process.exit(2);
}

const args = process.argv.slice(2);
const pos = [];
let threads = 2, opt = 'all';
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--threads') threads = Math.max(1, Number(args[++i]) || 1);
  else if (args[i] === '--no-opt') opt = 'disabled';
  else if (args[i].startsWith('--')) fail(`${args[i]}: unknown option (--threads T, --no-opt)`);
  else pos.push(args[i]);
}
if (pos.length !== 3) fail('usage: ort_ref.js MODEL INPUT_DIR OUTPUT_DIR [--threads T] [--no-opt]');
const [modelPath, inDir, outDir] = pos;

let ort;
for (const p of [path.join(__dirname, '..', '..', 'bench', 'ort', 'node_modules', 'onnxruntime-node'),
  'onnxruntime-node']) {
  try { ort = require(p); break; } catch (e) { /* next */ }
}
if (!ort) fail('onnxruntime-node is not installed (cd bench/ort && ONNXRUNTIME_NODE_INSTALL=skip npm install)');

// ---- minimal protobuf for onnx.TensorProto -------------------------------------------------------------------------
const TYPES = {  // TensorProto.DataType -> [ort type, typed array, bytes per element]
  1: ['float32', Float32Array, 4], 2: ['uint8', Uint8Array, 1], 3: ['int8', Int8Array, 1],
  4: ['uint16', Uint16Array, 2], 5: ['int16', Int16Array, 2], 6: ['int32', Int32Array, 4],
  7: ['int64', BigInt64Array, 8], 9: ['bool', Uint8Array, 1], 10: ['float16', Uint16Array, 2],
  11: ['float64', Float64Array, 8], 12: ['uint32', Uint32Array, 4], 13: ['uint64', BigUint64Array, 8],
};
const ORT_TO_ONNX = Object.fromEntries(Object.entries(TYPES).map(([k, v]) => [v[0], Number(k)]));

function readVarint(buf, st) {
  let result = 0n, shift = 0n;
  for (;;) {
    const b = buf[st.pos++];
    result |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) return result;
    shift += 7n;
  }
}

function decodeTensor(buf) {
  const st = {pos: 0};
  const t = {dims: [], dataType: 0, name: '', raw: null, floats: [], ints32: [], ints64: [], doubles: [], u64: []};
  const packedOrOne = (wire, fn) => {
    if (wire === 2) {
      const len = Number(readVarint(buf, st)), end = st.pos + len;
      while (st.pos < end) fn();
    } else fn();
  };
  while (st.pos < buf.length) {
    const key = Number(readVarint(buf, st)), field = key >> 3, wire = key & 7;
    if (field === 1) packedOrOne(wire, () => t.dims.push(Number(BigInt.asIntN(64, readVarint(buf, st)))));
    else if (field === 2) t.dataType = Number(readVarint(buf, st));
    else if (field === 4) packedOrOne(wire, () => { t.floats.push(buf.readFloatLE(st.pos)); st.pos += 4; });
    else if (field === 5) packedOrOne(wire, () => t.ints32.push(Number(BigInt.asIntN(32, readVarint(buf, st)))));
    else if (field === 7) packedOrOne(wire, () => t.ints64.push(BigInt.asIntN(64, readVarint(buf, st))));
    else if (field === 10) packedOrOne(wire, () => { t.doubles.push(buf.readDoubleLE(st.pos)); st.pos += 8; });
    else if (field === 11) packedOrOne(wire, () => t.u64.push(BigInt.asUintN(64, readVarint(buf, st))));
    else if (field === 8 || field === 9) {
      const len = Number(readVarint(buf, st));
      const bytes = buf.subarray(st.pos, st.pos + len);
      st.pos += len;
      if (field === 8) t.name = bytes.toString('utf8'); else t.raw = Buffer.from(bytes);
    } else {  // skip
      if (wire === 0) readVarint(buf, st);
      else if (wire === 1) st.pos += 8;
      else if (wire === 5) st.pos += 4;
      else if (wire === 2) st.pos += Number(readVarint(buf, st));
      else throw new Error(`unsupported wire type ${wire}`);
    }
  }
  const info = TYPES[t.dataType];
  if (!info) throw new Error(`unsupported TensorProto data_type ${t.dataType}`);
  const [type, Arr, size] = info;
  const n = t.dims.reduce((a, b) => a * b, 1);
  let data;
  if (t.raw) {
    const copy = new ArrayBuffer(t.raw.length);
    new Uint8Array(copy).set(t.raw);
    data = new Arr(copy, 0, t.raw.length / size);
  } else if (t.floats.length || type === 'float32') data = Float32Array.from(t.floats);
  else if (t.doubles.length || type === 'float64') data = Float64Array.from(t.doubles);
  else if (type === 'int64') data = BigInt64Array.from(t.ints64);
  else if (type === 'uint64') data = BigUint64Array.from(t.u64);
  else if (type === 'uint32') data = Uint32Array.from(t.u64.map(Number));
  else data = Arr.from(t.ints32);
  if (data.length !== n) throw new Error(`tensor '${t.name}': ${data.length} elements for dims [${t.dims}]`);
  return {name: t.name, tensor: new ort.Tensor(type, data, t.dims)};
}

function varint(v) {
  let x = BigInt.asUintN(64, BigInt(v));
  const out = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x) b |= 0x80;
    out.push(b);
  } while (x);
  return Buffer.from(out);
}

function encodeTensor(name, tensor) {
  const dt = ORT_TO_ONNX[tensor.type];
  if (!dt) throw new Error(`output '${name}': cannot write ${tensor.type}`);
  const d = tensor.data;
  const raw = Buffer.from(d.buffer, d.byteOffset, d.byteLength);
  const dims = Buffer.concat(tensor.dims.map(varint));
  const nameB = Buffer.from(name, 'utf8');
  return Buffer.concat([
    Buffer.from([0x0a]), varint(dims.length), dims,  // 1: dims (packed)
    Buffer.from([0x10]), varint(dt),                  // 2: data_type
    Buffer.from([0x42]), varint(nameB.length), nameB, // 8: name
    Buffer.from([0x4a]), varint(raw.length), raw,     // 9: raw_data
  ]);
}

async function main() {
  let session;
  try {
    session = await ort.InferenceSession.create(modelPath, {
      executionProviders: ['cpu'], graphOptimizationLevel: opt, intraOpNumThreads: threads,
      interOpNumThreads: 1, executionMode: 'sequential',
    });
  } catch (e) {
    fail(`${modelPath}: ${e.message}`);
  }
  const files = fs.readdirSync(inDir).filter((f) => /^input_\d+\.pb$/.test(f))
    .sort((a, b) => Number(a.match(/\d+/)[0]) - Number(b.match(/\d+/)[0]));
  const names = session.inputNames;
  if (files.length !== names.length) fail(`${inDir}: ${files.length} input files for ${names.length} model inputs (${names})`);
  const feeds = {};
  files.forEach((f, i) => {
    let dec;
    try { dec = decodeTensor(fs.readFileSync(path.join(inDir, f))); } catch (e) { fail(`${f}: ${e.message}`); }
    feeds[names.includes(dec.name) ? dec.name : names[i]] = dec.tensor;
  });
  const t0 = process.hrtime.bigint();
  let res;
  try { res = await session.run(feeds); } catch (e) { fail(`${modelPath}: run: ${e.message}`); }
  const runS = Number(process.hrtime.bigint() - t0) / 1e9;
  fs.mkdirSync(outDir, {recursive: true});
  const outs = [];
  session.outputNames.forEach((name, i) => {
    const t = res[name];
    fs.writeFileSync(path.join(outDir, `output_${i}.pb`), encodeTensor(name, t));
    outs.push({name, type: t.type, dims: t.dims});
  });
  process.stdout.write(JSON.stringify({runtime: 'onnxruntime-node', version: ort.env.versions ? ort.env.versions.node : '?',
    outputs: outs, run_s: runS}) + '\n');
}
main().catch((e) => fail(e.message));
