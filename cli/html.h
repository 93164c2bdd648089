// explain --html FILE: the plan as one self-contained web page (docs/cli.md, "explain").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/cost/cost.h"

namespace gspmd::cli {

/// Writes `p`'s plan to `path` as one HTML page that needs no network or other file: the mesh as a grid of device
/// ids; the collectives (`report`'s, make_report) as a table sortable by any column (click a header; "#sort=bytes"
/// in the address sorts on load, descending, "#sort=kind-up" ascending), each with its origin (unreduced_origins, else
/// axis_origins_str); the simulated step's timeline drawn in SVG from write_trace's JSON (`cost`); and each value's
/// sharding as sharding_picture and shard_ranges draw it, with its axes' origins (the first 2000 values). `model`
/// titles it. Written completely, then renamed into place. Throws InputError("PATH: cannot write").
void write_explain_html(const std::string& path, const std::string& model, const Compiled& p, const CostReport& cost,
                        const nlohmann::json& report);

}  // namespace gspmd::cli
