// Chrome trace writer: events are streamed line by line (the file grows with devices x nodes; nothing else does).
#include "cli/trace.h"

#include "cli/report.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace gspmd::cli {

namespace {

/// One iteration of one pass of the pipeline: its span in the simulated step (microseconds).
struct IterationSpan {
  bool backward = false;
  int64_t t = 0;
  double start = 0, end = 0;
};

/// The spans of the pipeline's iterations, from the global node names of the program's nodes.
std::vector<IterationSpan> iteration_spans(const SpmdProgram& p, const Graph& g, const std::vector<double>& start,
                                           const std::vector<double>& dur) {
  std::map<std::pair<bool, int64_t>, IterationSpan> spans;
  for (size_t i = 0; i < p.program.nodes.size(); ++i) {
    const int origin = i < p.node_origin.size() ? p.node_origin[i] : -1;
    if (origin < 0) continue;
    const std::string& name = g.nodes[static_cast<size_t>(origin)].name;
    size_t at = name.find("@t");
    size_t digits = at == std::string::npos ? std::string::npos : at + 2;
    if (at == std::string::npos && (at = name.find("pipeline/t")) != std::string::npos) digits = at + 10;
    if (digits == std::string::npos || digits >= name.size() || !std::isdigit(static_cast<unsigned char>(name[digits])))
      continue;
    const int64_t t = std::stoll(name.substr(digits));
    const bool backward = name.rfind("grad/", 0) == 0;
    auto [it, added] = spans.try_emplace({backward, t}, IterationSpan{backward, t, start[i], start[i] + dur[i]});
    it->second.start = std::min(it->second.start, start[i]);
    it->second.end = std::max(it->second.end, start[i] + dur[i]);
  }
  std::vector<IterationSpan> out;
  for (const auto& [key, span] : spans) out.push_back(span);
  return out;
}

/// "device 3", "devices 0..15", or "devices 0,1,4,5" / "devices 0,2,4,...,30 (16)" for a list not in one run.
std::string devices_label(const std::vector<int64_t>& ds) {
  if (ds.size() == 1) return fmt::format("device {}", ds[0]);
  if (ds.back() - ds.front() + 1 == static_cast<int64_t>(ds.size()))
    return fmt::format("devices {}..{}", ds.front(), ds.back());
  if (ds.size() <= 8) return fmt::format("devices {}", fmt::join(ds, ","));
  return fmt::format("devices {},{},{},...,{} ({})", ds[0], ds[1], ds[2], ds.back(), ds.size());
}

}  // namespace

std::optional<PipelineTrack> pipeline_track(const Compiled& p) {
  if (!p.pipeline) return std::nullopt;
  const int axis = p.program.mesh.axis_index(p.pipeline_axis);
  if (axis < 0) return std::nullopt;
  return PipelineTrack{&p.graph, &*p.pipeline, axis};
}

void trace_json(std::ostream& f, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                const std::vector<std::vector<ExecutedStep>>& measured, const std::optional<PipelineTrack>& pipeline) {
  const Graph& prog = p.program;
  // The per-node part of every event (name, category, args) is the same on every device: format it once.
  std::vector<std::string> body(prog.nodes.size());
  std::vector<double> start(prog.nodes.size()), dur(prog.nodes.size());
  std::vector<char> on_comm(prog.nodes.size(), 0);
  for (size_t i = 0; i < prog.nodes.size(); ++i) {
    const Node& n = prog.nodes[i];
    nlohmann::json args = {{"op", n.op_type}};
    const std::optional<Collective> kind = collective_of(n);
    const bool coll = kind.has_value();
    if (coll) {
      args["kind"] = std::string(collective_name(*kind));
      args["mesh_axes"] = p.mesh.axis_names(mesh_axes_attr(n));
      int64_t bytes = 0;  // as CollectiveRecord: the larger of the local operand and result
      for (const std::vector<int>* list : {&n.inputs, &n.outputs})
        for (int v : *list)
          if (v >= 0)
            bytes = std::max(
                bytes, num_elements(prog.values[v].shape) * static_cast<int64_t>(dtype_size(prog.values[v].dtype)));
      args["bytes"] = bytes;
    } else {
      args["flops"] = node_flops(prog, n);
    }
    body[i] = fmt::format(R"("name":{},"cat":"{}","args":{})", nlohmann::json(n.name).dump(),
                          coll ? "collective" : "compute", args.dump());
    start[i] = cost.node_start_s.at(i) * 1e6;
    dur[i] = cost.node_time_s.at(i) * 1e6;
    on_comm[i] = cost.overlap && coll;
  }
  f << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  f << fmt::format(R"({{"ph":"M","pid":0,"name":"process_name","args":{{"name":{}}}}})",
                   nlohmann::json("gspmd-onnx " + target).dump());
  // Every device runs the same program, whose simulated timeline is the same on each: one track for all of them
  // (tid 0), and with overlap a second one for the collectives (tid 1), which run beside the compute.
  const int64_t n = p.mesh.num_devices();
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) all[static_cast<size_t>(d)] = d;
  const std::string label = devices_label(all);
  auto track = [&](int64_t tid, const std::string& name) {
    f << fmt::format(",\n{{\"ph\":\"M\",\"pid\":0,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}", tid,
                     nlohmann::json(name).dump());
  };
  track(0, label);
  if (cost.overlap) track(1, label + " collectives");
  for (size_t i = 0; i < body.size(); ++i)
    f << fmt::format(",\n{{\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.6f},\"dur\":{:.6f},{}}}", on_comm[i] ? 1 : 0,
                     start[i], dur[i], body[i]);
  // The pipeline: per stage (its devices' timelines are alike), what it computes in each iteration.
  if (pipeline) {
    const PipelineLayout& l = *pipeline->layout;
    const std::vector<IterationSpan> spans = iteration_spans(p, *pipeline->graph, start, dur);
    const int64_t base = cost.overlap ? 2 : 1;
    std::vector<std::vector<int64_t>> stage_devices(static_cast<size_t>(l.stages));
    for (int64_t d = 0; d < n; ++d)
      stage_devices[static_cast<size_t>(p.mesh.tile_index(d, {pipeline->axis}))].push_back(d);
    for (int64_t s = 0; s < l.stages; ++s) {
      track(base + s, fmt::format("stage {}: {}", s, devices_label(stage_devices[static_cast<size_t>(s)])));
      for (const IterationSpan& sp : spans) {
        const int64_t m = l.microbatch_at(sp.t, s);
        std::string what = sp.t >= l.iterations ? "the last results leave" : "bubble";
        if (m >= 0) {
          std::vector<std::string> layers;
          for (int64_t k = 0; k < l.slots; ++k) {
            layers.push_back(l.block_name(l.layer_at(sp.t, s, k)));
          }
          what = fmt::format("microbatch {}, layer{} {}", m, layers.size() > 1 ? "s" : "", fmt::join(layers, ", "));
        }
        f << fmt::format(
            ",\n{{\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.6f},\"dur\":{:.6f},\"name\":{},\"cat\":\"pipeline\","
            "\"args\":{{\"iteration\":{},\"stage\":{},\"microbatch\":{}}}}}",
            base + s, sp.start, sp.end - sp.start,
            nlohmann::json(fmt::format("{}t{}: {}", sp.backward ? "backward " : "", sp.t, what)).dump(), sp.t, s, m);
      }
    }
  }
  // The measured steps of every MPI rank: a second process beside the simulated pod.
  if (!measured.empty())
    f << ",\n{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"measured: MPI ranks (wall "
         "time)\"}}";
  for (size_t r = 0; r < measured.size(); ++r) {
    f << fmt::format(
        ",\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"rank {}\"}}}}", r, r);
    for (const ExecutedStep& st : measured[r]) {
      std::string name, ops;
      for (size_t k = 0; k < st.nodes.size(); ++k) {
        name += (k ? " + " : "") + st.nodes[k];
        ops += (k ? "+" : "") + st.ops[k];
      }
      const nlohmann::json args = {{"op", ops}, {"nodes", st.nodes}};
      f << fmt::format(
          ",\n{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},\"name\":{},\"cat\":\"measured\","
          "\"args\":{}}}",
          r, st.start_s * 1e6, (st.end_s - st.start_s) * 1e6, nlohmann::json(name).dump(), args.dump());
    }
  }
  f << "\n]}\n";
}

void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                 const std::vector<std::vector<ExecutedStep>>& measured, const std::optional<PipelineTrack>& pipeline) {
  write_atomically(path, [&](std::ostream& f) { trace_json(f, p, cost, target, measured, pipeline); });
}

}  // namespace gspmd::cli
