// Chrome trace writer: events are streamed line by line (the file grows with devices x nodes; nothing else does).
#include "cli/trace.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gspmd::cli {

void write_trace(const std::string& path, const SpmdProgram& p, const CostReport& cost, const std::string& target,
                 const std::vector<std::vector<ExecutedStep>>& measured) {
  const std::string tmp = path + ".tmp";  // written completely, then renamed: never a half-written trace
  std::ofstream f(tmp);
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
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
  // Without overlap one track per device (tid = device); with it, collectives get a second track per device
  // (tid = devices + device), since they run beside the compute.
  const int64_t n = p.mesh.num_devices();
  for (int64_t d = 0; d < n; ++d) {
    f << fmt::format(
        ",\n{{\"ph\":\"M\",\"pid\":0,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"device {}\"}}}}", d, d);
    if (cost.overlap)
      f << fmt::format(
          ",\n{{\"ph\":\"M\",\"pid\":0,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"device {} "
          "collectives\"}}}}",
          n + d, d);
    for (size_t i = 0; i < body.size(); ++i)
      f << fmt::format(",\n{{\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.6f},\"dur\":{:.6f},{}}}",
                       on_comm[i] ? n + d : d, start[i], dur[i], body[i]);
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
  f.close();
  std::error_code ec;
  if (!f || (std::filesystem::rename(tmp, path, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot write", path));
  }
}

}  // namespace gspmd::cli
