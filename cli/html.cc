// explain --html FILE: one self-contained page (no network, no external file) with the mesh, every value's sharding
// as a picture with its shards' index ranges, the collectives as a sortable table with their origins, and the
// simulated step's timeline drawn from the Chrome-trace data (docs/cli.md, "explain").
#include "cli/html.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/report.h"
#include "cli/trace.h"

namespace gspmd::cli {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// JSON for a <script> element: "</" cannot end the script early.
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump();
  for (size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3) s.replace(at, 2, "<\\/");
  return s;
}

/// The mesh as a grid: rows over the first axis, columns over the others (device ids in mesh order, or as the
/// device order lists them).
std::string mesh_table(const DeviceMesh& mesh) {
  const int64_t rows = mesh.rank() > 0 ? mesh.shape[0] : 1;
  const int64_t cols = mesh.num_devices() / std::max<int64_t>(rows, 1);
  std::string out = "<table class=\"mesh\">";
  for (int64_t r = 0; r < rows; ++r) {
    out += "<tr>";
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t k = r * cols + c;
      const int64_t dev = mesh.has_device_order() ? mesh.devices[static_cast<size_t>(k)] : k;
      out += fmt::format("<td>{}</td>", dev);
    }
    out += "</tr>";
  }
  return out + "</table>";
}

constexpr size_t kMaxValues = 2000;  // values pictured; the rest are counted

// clang-format off
constexpr const char* kStyle = R"CSS(
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.mesh td { border: 1px solid #888; width: 2.4em; text-align: center; padding: .3em; background: #eef4ff; }
table.mesh { border-collapse: collapse; }
#collectives { border-collapse: collapse; width: 100%; }
#collectives th, #collectives td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
#collectives th { background: #f0f0f0; cursor: pointer; user-select: none; }
#collectives td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #fafafa; border: 1px solid #eee; padding: .5em; overflow-x: auto; }
details summary { cursor: pointer; padding: .15em 0; }
svg text { font-size: 11px; }
)CSS";

/// The timeline's place and the collectives table's header (the script fills both).
constexpr const char* kSections = R"HTML(<h2>Simulated timeline</h2>
<svg id="timeline" width="1200" height="10"></svg>
<h2>Collectives (<span id="collective-count"></span>)</h2>
<p>Click a column to sort by it.</p>
<table id="collectives"><thead><tr>
<th data-key="kind">kind</th><th data-key="axes">axes</th><th data-key="bytes">bytes</th><th data-key="count">count</th>
<th data-key="time_s">time (us)</th><th data-key="node">for node</th><th data-key="value">value</th>
<th data-key="origin">origin</th><th data-key="reason">reason</th></tr></thead><tbody></tbody></table>
)HTML";

/// Builds the collectives table from its JSON (sortable by a header click, or "#sort=KEY[-up]" on load) and draws the
/// timeline: one row per track of the trace, one bar per complete event.
constexpr const char* kScript = R"JS(
"use strict";
const rows = JSON.parse(document.getElementById("collective-data").textContent);
const body = document.querySelector("#collectives tbody");
document.getElementById("collective-count").textContent = rows.reduce((n, r) => n + r.count, 0);
function cell(text, num) {
  const td = document.createElement("td");
  td.textContent = text;
  if (num) td.className = "num";
  return td;
}
function render() {
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.append(cell(r.kind), cell(r.axes.join(",")), cell(r.bytes, true), cell(r.count, true),
              cell((r.time_s * 1e6).toFixed(3), true), cell(r.node || "(graph output)"), cell(r.value),
              cell(r.origin), cell(r.reason));
    body.append(tr);
  }
}
let sorted = {key: null, down: false};
function sortBy(key, down) {
  const text = v => Array.isArray(v) ? v.join(",") : v;
  rows.sort((a, b) => {
    const x = text(a[key]), y = text(b[key]);
    const c = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
    return down ? -c : c;
  });
  sorted = {key, down};
  render();
}
for (const th of document.querySelectorAll("#collectives th"))
  th.addEventListener("click", () => sortBy(th.dataset.key, sorted.key === th.dataset.key ? !sorted.down : true));
const m = /sort=([a-z_]+)(-up)?/.exec(location.hash);
if (m) sortBy(m[1], !m[2]); else render();

const trace = JSON.parse(document.getElementById("trace-data").textContent).traceEvents;
const names = new Map();
for (const e of trace) if (e.ph === "M" && e.name === "thread_name") names.set(e.tid, e.args.name);
const spans = trace.filter(e => e.ph === "X");
const end = Math.max(1e-9, ...spans.map(e => e.ts + e.dur));
const svg = document.getElementById("timeline"), ns = "http://www.w3.org/2000/svg";
const left = 180, width = 1200 - left - 10, row = 22;
const tids = [...names.keys()].sort((a, b) => a - b);
svg.setAttribute("height", tids.length * row + 24);
tids.forEach((tid, i) => {
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 0);
  label.setAttribute("y", i * row + 15);
  label.textContent = names.get(tid);
  svg.append(label);
});
for (const e of spans) {
  const r = document.createElementNS(ns, "rect");
  r.setAttribute("x", left + e.ts / end * width);
  r.setAttribute("y", tids.indexOf(e.tid) * row + 3);
  r.setAttribute("width", Math.max(0.5, e.dur / end * width));
  r.setAttribute("height", row - 6);
  r.setAttribute("fill", e.cat === "collective" ? "#d9534f" : e.cat === "pipeline" ? "#9b7fd1" : "#4a90d9");
  const t = document.createElementNS(ns, "title");
  t.textContent = e.name + " (" + (e.args.op || e.cat) + "): " + e.dur.toFixed(3) + " us";
  r.append(t);
  svg.append(r);
}
const axis = document.createElementNS(ns, "text");
axis.setAttribute("x", left);
axis.setAttribute("y", tids.length * row + 18);
axis.textContent = "0 .. " + end.toFixed(3) + " us (red: collectives)";
svg.append(axis);
)JS";
// clang-format on

}  // namespace

void write_explain_html(const std::string& path, const std::string& model, const Compiled& p, const CostReport& cost,
                        const nlohmann::json& report) {
  const Graph& g = p.graph;
  const DeviceMesh& mesh = p.program.mesh;
  // The collectives with their origins: the reduction that made a partial value, else the annotations that gave the
  // value its axes.
  nlohmann::json colls = report["collectives"];
  for (auto& c : colls) {
    const int v = g.find(c["value"].get<std::string>());
    std::string origin;
    if (v >= 0) {
      origin = fmt::format("{}", fmt::join(unreduced_origins(p, v), "; "));
      if (origin.empty()) origin = axis_origins_str(g, p.plan, p.annotations.by_value, mesh, v);
    }
    c["origin"] = origin;
  }
  std::ostringstream trace;
  trace_json(trace, p.program, cost, p.target.name, {}, pipeline_track(p));

  std::string values;
  size_t shown = 0;
  std::vector<char> is_input(g.values.size(), 0);
  for (int v : g.inputs) is_input[static_cast<size_t>(v)] = 1;
  for (int v = 0; v < static_cast<int>(g.values.size()) && shown < kMaxValues; ++v) {
    const Value& val = g.values[static_cast<size_t>(v)];
    if (val.producer < 0 && !val.is_initializer && !is_input[static_cast<size_t>(v)]) continue;  // an unused name
    ++shown;
    const TensorSharding& s = p.program.final_shardings[static_cast<size_t>(v)];
    std::string body = sharding_picture(val.shape, s, mesh) + shard_ranges(val.shape, s, mesh);
    if (const std::string axes = axis_origins_str(g, p.plan, p.annotations.by_value, mesh, v); !axes.empty())
      body += "axes      " + axes + "\n";
    for (const std::string& line : unreduced_origins(p, v)) body += "unreduced " + line + "\n";
    values += fmt::format("<details><summary><code>{}</code> {} {} <code>{}</code></summary><pre>{}</pre></details>\n",
                          escape(val.name), dtype_name(val.dtype), shape_str(val.shape),
                          escape(s.to_partition_spec(mesh)), escape(body));
  }
  if (shown == kMaxValues)
    values += fmt::format("<p>(the first {} values; explain --value NAME for another)</p>\n", shown);

  const nlohmann::json sim = report["simulated"];
  const DeviceMesh user = mesh.user();
  std::string page = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  page +=
      fmt::format("<title>gspmd-onnx explain: {}</title>\n<style>{}</style></head>\n<body>\n", escape(model), kStyle);
  page += fmt::format("<h1>gspmd-onnx explain: <code>{}</code></h1>\n", escape(model));
  page += fmt::format("<p>Simulated step <b>{:.3f} us</b> on {}: compute {:.3f} us, communication {:.3f} us.</p>\n",
                      sim["step_time_s"].get<double>() * 1e6, escape(p.target.name),
                      sim["compute_time_s"].get<double>() * 1e6, sim["communication_time_s"].get<double>() * 1e6);
  page += fmt::format(
      "<h2 id=\"mesh\">Mesh {}: {} devices</h2>\n<p>Rows over <code>{}</code>, columns over the other axes; each cell "
      "a device id.</p>\n{}\n",
      escape(user.str()), user.num_devices(), escape(user.rank() > 0 ? user.axes[0] : ""), mesh_table(user));
  page += kSections;
  page += fmt::format("<h2>Values ({})</h2>\n{}", shown, values);
  page += fmt::format("<script id=\"collective-data\" type=\"application/json\">{}</script>\n", script_json(colls));
  page += fmt::format("<script id=\"trace-data\" type=\"application/json\">{}</script>\n",
                      script_json(nlohmann::json::parse(trace.str())));
  page += fmt::format("<script>{}</script>\n</body></html>\n", kScript);
  write_atomically(path, [&](std::ostream& f) { f << page; });
}

}  // namespace gspmd::cli
