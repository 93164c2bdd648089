// The human summary of a report (cli/report.h, print_summary): one line per topic, in the order a reader asks.
#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/report.h"

namespace gspmd::cli {
namespace {

/// The model, the sharding file when it was found without --shardings, the mesh and target, the precision.
void print_setup(const nlohmann::json& r, const std::string& model) {
  std::vector<std::string> mesh;
  for (size_t a = 0; a < r["mesh"]["axes"].size(); ++a)
    mesh.push_back(fmt::format("{}={}", r["mesh"]["axes"][a].get<std::string>(), r["mesh"]["shape"][a].get<int64_t>()));
  fmt::print("model     {}\n", model);
  // The annotations read without --shardings are named, so that a sibling file picked up by itself is no surprise.
  if (r.value("sharding_file_implicit", false)) {
    const std::string f = r["sharding_file"].get<std::string>();
    fmt::print("shardings {} ({}; --shardings FILE reads another)\n", f,
               f == model ? "the model's own annotations" : "found beside the model");
  }
  fmt::print("mesh      {{{}}}: {} devices, target {} ({}, device order {})\n", fmt::join(mesh, ", "),
             r["devices"].get<int64_t>(), r["target"].get<std::string>(),
             r["target_spec"]["topology"].get<std::string>(), r["device_order"].get<std::string>());
  if (const std::string pr = r.value("precision", "as-loaded"); pr != "as-loaded")
    fmt::print("precision {}\n",
               pr == "mixed"      ? "mixed: bfloat16 compute, float32 weights (each cast where read), gradients of the "
                                    "weights and optimizer state"
               : pr == "autocast" ? "autocast: contractions in bfloat16 (operands cast where read), every other op in "
                                    "the widest type of its inputs, float32 weights (torch.autocast)"
               : pr == "bf16"     ? "bf16: every float value in bfloat16"
                                  : "f32: every float value in float32");
}

/// Symbolic dims (their hints, the smallest sizes the files serve) and data-dependent ones (their bounds).
void print_dims(const nlohmann::json& r) {
  const nlohmann::json runtime = r.value("data_dependent_dims", nlohmann::json::object());
  DimBindings hints;
  if (r.contains("dim_hints"))
    for (const auto& [sym, hint] : r["dim_hints"].items())
      if (!runtime.contains(sym)) hints[sym] = hint.get<int64_t>();
  if (!hints.empty())
    fmt::print(
        "dims      symbolic, kept in the device files; sizes and times below at the hints {} (--hint N=V to "
        "plan at others, --dim N=V to bind)\n",
        bindings_str(hints));
  if (r.contains("smallest_sizes")) {  // a halo window over a symbolic dim (docs/shapes.md)
    std::vector<std::string> least;
    for (const auto& [sym, v] : r["smallest_sizes"].items())
      least.push_back(fmt::format("{} >= {}", sym, v.get<int64_t>()));
    fmt::print("dims      the device files serve {} (halo windows need shards as wide as their halos)\n",
               fmt::join(least, ", "));
  }
  if (!runtime.empty()) {
    constexpr size_t kShown = 6;  // a detector has hundreds: report.json lists them all
    std::vector<std::string> dims;
    for (const auto& [sym, d] : runtime.items()) {
      if (dims.size() == kShown) {
        dims.push_back(fmt::format("and {} more (report.json data_dependent_dims)", runtime.size() - kShown));
        break;
      }
      dims.push_back(d["bound"].get<int64_t>() >= 0
                         ? fmt::format("{} <= {}{} ({})", sym, d["bound"].get<int64_t>(),
                                       d.value("bound_from", "") == "--dim" ? " from --dim" : "",
                                       d["counts"].get<std::string>())
                         : fmt::format("{} unbounded, at {} ({})", sym, r["dim_hints"][sym].get<int64_t>(),
                                       d["counts"].get<std::string>()));
    }
    fmt::print(
        "dims      data-dependent, known at run time and never split; sizes and times below at their bounds: "
        "{}\n",
        fmt::join(dims, ", "));
  }
}

/// The training step: loss, weights, weight-update sharding, what is not trained; rematerialization.
void print_training(const nlohmann::json& r) {
  if (r.contains("training"))
    fmt::print("training  one step: loss '{}', {} weights ({}){}{}{}\n", r["training"]["loss"].get<std::string>(),
               r["training"]["weights"].size(), human_bytes(r["training"]["weight_bytes"].get<double>()),
               r["training"]["shard_update"].is_string()
                   ? fmt::format(", weight update sharded over '{}'", r["training"]["shard_update"].get<std::string>())
                   : std::string(),
               r["training"]["unused"].empty()
                   ? std::string()
                   : fmt::format(", {} not reaching the loss", r["training"]["unused"].size()),
               r["training"]["ignored"].empty()
                   ? std::string()
                   : fmt::format("; not trained, not floating point: {}",
                                 fmt::join(r["training"]["ignored"].get<std::vector<std::string>>(), ", ")));
  if (r.contains("training") && r["training"].value("recomputed_nodes", 0) > 0)
    fmt::print(
        "remat     {}: {} forward nodes recomputed in the backward pass ({:.3g} FLOPs, {:.1f}% of the model FLOPs)\n",
        r["training"]["remat"].get<std::string>(), r["training"]["recomputed_nodes"].get<int>(),
        r["training"]["recomputed_flops"].get<double>(),
        100 * r["training"]["recomputed_flops"].get<double>() / std::max(1.0, r["model_flops"].get<double>()));
}

/// Pipeline parallelism: the stage counts --auto tried, the schedule, its microbatches and bubble.
void print_pipeline(const nlohmann::json& r) {
  if (r.contains("auto_stages")) {
    std::vector<std::string> tried;
    for (const auto& e : r["auto_stages"])
      tried.push_back(e.contains("error")
                          ? fmt::format("{}: refused", e["stages"].get<int64_t>())
                          : fmt::format("{}: {}{}", e["stages"].get<int64_t>(), human_time(e["step_s"].get<double>()),
                                        e["fits"].get<bool>() ? "" : " (too big)"));
    fmt::print("stages    --auto chose {} stage(s){}; tried {}\n",
               r.contains("pipeline") ? r["pipeline"]["stages"].get<int64_t>() : int64_t{1},
               r.contains("pipeline") ? fmt::format(" over '{}'", r["pipeline"]["axis"].get<std::string>()) : "",
               fmt::join(tried, ", "));
  }
  if (r.contains("pipeline")) {
    const auto& pl = r["pipeline"];
    fmt::print("pipeline  {} over {}: {} stages of {} {}, {} microbatches of {}, {} iterations, bubble {:.1f}%{}\n",
               pl["schedule"].get<std::string>(), pl["axis"].get<std::string>(), pl["stages"].get<int64_t>(),
               pl["rounds"].get<int64_t>() * pl["layers_per_iteration"].get<int64_t>(),
               pl["layers_per_block"].get<int64_t>() > 1
                   ? fmt::format("block(s) of {} layers", pl["layers_per_block"].get<int64_t>())
                   : std::string("layer(s)"),
               pl["microbatches"].get<int64_t>(), pl["microbatch"].get<int64_t>(), pl["iterations"].get<int64_t>(),
               100 * pl["bubble_fraction"].get<double>(),
               pl["padding_slots"].get<int64_t>() > 0
                   ? fmt::format(" ({} padding slots)", pl["padding_slots"].get<int64_t>())
                   : std::string());
    if (pl.contains("auto_microbatches")) {
      std::vector<std::string> tried;
      for (const auto& c : pl["auto_microbatches"])
        tried.push_back(fmt::format("{}: {}{}", c["microbatches"].get<int64_t>(), human_time(c["step_s"].get<double>()),
                                    c["fits"].get<bool>() ? "" : " (too big)"));
      fmt::print("          --auto chose {} microbatches; steps tried: {}\n", pl["microbatches"].get<int64_t>(),
                 fmt::join(tried, ", "));
    }
  }
}

/// The collectives: one line per node and value while they fit on a screen, else one per kind and axes.
void print_collectives(const nlohmann::json& r) {
  int64_t total = 0;
  double bytes = 0;
  for (const auto& c : r["collectives"]) {
    total += c["count"].get<int64_t>();
    bytes += c["bytes"].get<double>() * c["count"].get<double>();
  }
  fmt::print("collectives {} ({} per device per step)\n", total, human_bytes(bytes));
  // Each entry on a line of its own while they fit on a screen; beyond that one line per kind and mesh axes (a
  // 96-layer training step has thousands of entries; the report lists them all).
  constexpr size_t kListed = 40;
  if (r["collectives"].size() <= kListed) {
    // Entries that differ only in their reasons print alike: one line, their counts summed, in order of first use.
    struct Line {
      std::string head, at;  // "kind over {axes} bytes", "node (value)"
      int64_t count = 0;
    };
    std::vector<Line> lines;
    std::map<std::pair<std::string, std::string>, size_t> index;
    for (const auto& c : r["collectives"]) {
      const std::string node = c["node"].get<std::string>(), value = c["value"].get<std::string>();
      Line l{
          fmt::format("{:<18} over {{{}}} {:>10}", c["kind"].get<std::string>(),
                      fmt::join(c["axes"].get<std::vector<std::string>>(), ","), human_bytes(c["bytes"].get<double>())),
          node.empty() ? fmt::format("graph output '{}'", value) : fmt::format("{} ({})", node, value)};
      auto [it, fresh] = index.emplace(std::pair{l.head, l.at}, lines.size());
      if (fresh) lines.push_back(std::move(l));
      lines[it->second].count += c["count"].get<int64_t>();
    }
    for (const Line& l : lines) fmt::print("  {} x{}  at {}\n", l.head, l.count, l.at);
  } else {
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> by;  // (kind, axes): count, bytes
    for (const auto& c : r["collectives"]) {
      auto& [n, b] = by[{c["kind"].get<std::string>(),
                         fmt::format("{}", fmt::join(c["axes"].get<std::vector<std::string>>(), ","))}];
      n += c["count"].get<int64_t>();
      b += c["bytes"].get<double>() * c["count"].get<double>();
    }
    for (const auto& [key, v] : by)
      fmt::print("  {:<18} over {{{}}} x{} ({} per device)\n", key.first, key.second, v.first, human_bytes(v.second));
    fmt::print("  ({} entries by node and value in the report's \"collectives\")\n", r["collectives"].size());
  }
}

/// The warnings, and the padded split dims (the first few).
void print_warnings(const nlohmann::json& r) {
  for (const auto& w : r["warnings"]) fmt::print("warning   {}\n", w.get<std::string>());
  // Padded split dims: the first few, then how many more the report lists.
  constexpr size_t kPaddingLines = 8;
  const nlohmann::json& pads = r.contains("padding") ? r["padding"] : nlohmann::json::array();
  for (size_t i = 0; i < pads.size() && i < kPaddingLines; ++i) {
    const auto& d = pads[i];
    const int64_t shards = d["shards"].get<int64_t>(), empty = d["empty_shards"].get<int64_t>();
    fmt::print("warning   padding: '{}' dim {} of {} over {{{}}}={}: {}\n", d["value"].get<std::string>(),
               d["dim"].get<int>(), d["size"].get<int64_t>(), fmt::join(d["axes"].get<std::vector<std::string>>(), ","),
               shards,
               empty > 0 ? fmt::format("{} of {} shards hold only padding", empty, shards)
                         : fmt::format("shards of {}, {} of {} indices padding", d["per_shard"].get<int64_t>(),
                                       d["padding"].get<int64_t>(), d["per_shard"].get<int64_t>() * shards));
  }
  if (pads.size() > kPaddingLines)
    fmt::print("warning   padding: {} more padded dims in the report's \"padding\"\n", pads.size() - kPaddingLines);
}

/// The simulated step and its FLOPs utilization; the peak memory per device by kind.
void print_step(const nlohmann::json& r) {
  const auto& s = r["simulated"];
  fmt::print("simulated step {} (compute {}, communication {}{}), FLOPs utilization {:.1f}% of {:.3g} model FLOPs\n",
             human_time(s["step_time_s"].get<double>()), human_time(s["compute_time_s"].get<double>()),
             human_time(s["communication_time_s"].get<double>()), s.value("overlap", false) ? ", overlapped" : "",
             100 * s["flops_utilization"].get<double>(), r["model_flops"].get<double>());
  if (!r.contains("host") && !s["per_device"].empty() && s["per_device"][0].contains("peak_memory_bytes")) {
    std::vector<std::string> parts;  // what is live at the peak, by kind
    for (size_t k = 0; k < kMemoryKinds && s.contains("memory"); ++k) {
      const std::string kind(memory_kind_name(static_cast<MemoryKind>(k)));
      const double b = s["memory"]["at_peak"].value(kind, 0.0);
      if (b > 0) parts.push_back(fmt::format("{} {}", kind, human_bytes(b)));
    }
    fmt::print("memory    {} per device at peak (static estimate{}{})\n",
               human_bytes(s["per_device"][0]["peak_memory_bytes"].get<double>()), parts.empty() ? "" : ": ",
               fmt::join(parts, ", "));
  }
}

/// The automatic search: its decisions, the chosen plan and the baselines.
void print_auto(const nlohmann::json& r) {
  if (r.contains("auto")) {
    const auto& a = r["auto"];
    fmt::print(
        "auto      searched {} plans in {} ({} decisions for {} tensors, {} descents, {} sweeps{}{}), memory "
        "limit {}\n",
        a["evaluations"].get<int64_t>(), human_time(a["search_time_s"].get<double>()), a["groups"].get<int64_t>(),
        a["variables"].get<int64_t>(), a["starts"].get<int64_t>(), a["sweeps"].get<int64_t>(),
        a["budget_exhausted"].get<bool>() ? ", time budget spent" : "",
        a["layer_blocks"].get<int64_t>() > 0
            ? fmt::format(", costed on 1 and 2 of {} alike layer blocks", a["layer_blocks"].get<int64_t>())
            : "",
        human_bytes(a["memory_limit_bytes"].get<double>()));
    for (const auto& c : a["choices"]) {
      if (c["free"].get<bool>()) continue;
      fmt::print("  {:<40} x{:<3} {}\n", c["group"].get<std::string>(), c["values"].size(), c["spec"].dump());
    }
    auto line = [&](const nlohmann::json& c) {
      if (!c["valid"].get<bool>())
        return fmt::format("  {:<18} not partitionable: {}", c["name"].get<std::string>(),
                           c["error"].get<std::string>());
      std::string step;  // a training step's build: its remat policy and weight-update sharding
      if (r.contains("training"))
        step =
            fmt::format(", remat {}{}", c["remat"].get<std::string>(),
                        c["shard_update"].is_string() ? ", update sharded over " + c["shard_update"].get<std::string>()
                                                      : std::string());
      if (c.contains("same_as"))
        return fmt::format("  {:<18} the same plan as {}", c["name"].get<std::string>(),
                           c["same_as"].get<std::string>());
      return fmt::format("  {:<18} step {:>12}  memory {:>10} per device{}{}{}", c["name"].get<std::string>(),
                         human_time(c["step_time_s"].get<double>()), human_bytes(c["peak_memory_bytes"].get<double>()),
                         step, c.value("estimated", false) ? " (estimated)" : "",
                         c["fits"].get<bool>() ? "" : "  (does not fit)");
    };
    fmt::print("{}\n", line(a["chosen"]));
    for (const auto& b : a["baselines"]) fmt::print("{}\n", line(b));
  }
}

/// What a run measured and checked: the host run, --check, the expected outputs.
void print_results(const nlohmann::json& r) {
  if (r.contains("host")) {
    const auto& s = r["simulated"];
    int64_t peak = 0;
    for (const auto& d : s["per_device"]) peak = std::max<int64_t>(peak, d.value("peak_memory_bytes", int64_t{0}));
    fmt::print("host      {} wall, {:.2f} GFLOP/s, peak device memory {}\n",
               human_time(r["host"]["wall_s"].get<double>()), r["host"]["gflops"].get<double>(),
               human_bytes(static_cast<double>(peak)));
  }
  if (r.contains("check")) {
    const auto& c = r["check"];
    fmt::print("check     {} (max abs error {:.3g}, max rel error {:.3g}; {}){}\n",
               c["passed"].get<bool>() ? "passed" : "FAILED", c["max_abs_error"].get<double>(),
               c["max_rel_error"].get<double>(), c.value("tolerance", ""),
               c.contains("worst") ? ": " + c["worst"].get<std::string>() : "");
    if (c.contains("amplified")) {
      std::vector<std::string> ws;
      int64_t n = 0;
      double worst = 0;
      for (const auto& a : c["amplified"]) {
        ws.push_back(fmt::format("{} ({} of {})", a["weight"].get<std::string>(), a["elements"].get<int64_t>(),
                                 a["of"].get<int64_t>()));
        n += a["elements"].get<int64_t>();
        worst = std::max(worst, a["max_abs_error"].get<double>());
      }
      fmt::print(
          "amplified {} elements of {} weights differ by up to {:.3g} where their gradient is within the tolerance "
          "of 0: the optimizer divides it by its own size, so its sign, rounding noise, decides the step (not "
          "failed; docs/training.md): {}\n",
          n, ws.size(), worst, fmt::join(ws, ", "));
    }
  }
  if (r.contains("expected")) {
    const auto& e = r["expected"];
    // An infinite error (a shape or count mismatch) is null in JSON.
    auto err = [](const nlohmann::json& x) { return x.is_number() ? fmt::format("{:.3g}", x.get<double>()) : "inf"; };
    fmt::print("expected  {} against {}{}\n", e["passed"].get<bool>() ? "passed" : "FAILED",
               e["dir"].get<std::string>(), e.contains("worst") ? ": " + e["worst"].get<std::string>() : "");
    for (const auto& o : e["outputs"])
      fmt::print("  {:<14} {:<24} max abs error {}, max rel error {}{}\n",
                 std::filesystem::path(o["file"].get<std::string>()).filename().string(), o["name"].get<std::string>(),
                 err(o["max_abs_error"]), err(o["max_rel_error"]), o["passed"].get<bool>() ? "" : "  FAILED");
  }
}

}  // namespace

void print_summary(const nlohmann::json& r, const std::string& model) {
  print_setup(r, model);
  print_dims(r);
  print_training(r);
  print_pipeline(r);
  print_collectives(r);
  print_warnings(r);
  print_step(r);
  print_auto(r);
  print_results(r);
}

}  // namespace gspmd::cli
