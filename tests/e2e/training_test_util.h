// The training tests' helpers (tests/e2e/training_*_test.cc): exported models, run --check, collective counts.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "onnx_frontend/frontend.h"
#include "tests/e2e/cnn_export.h"
#include "tests/e2e/e2e_util.h"

namespace e2e {

const std::string kTrain = " --training --loss cross-entropy:labels";

inline std::string plan(const std::string& name) { return " --shardings testdata/gpt/gpt." + name + ".sharding.json"; }

struct Case {
  std::string plan, mesh, extra;
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.plan << " on " << c.mesh << c.extra; }

class GptTraining : public ::testing::TestWithParam<Case> {};

/// Runs the Python `body` on the device file `file` (Debian's onnx), with `ins` (input names, in order), `outs`
/// (output names) and `inits` (initializer names) defined.
inline CmdResult inspect_device_file(const fs::path& file, const std::string& body, const std::string& tag) {
  return sh(debian_python() +
                " -c \"import onnx, sys\n"
                "g = onnx.load(sys.argv[1]).graph\n"
                "ins = [i.name for i in g.input]; outs = {o.name for o in g.output}\n"
                "inits = {i.name for i in g.initializer}\n" +
                body + "\" " + file.string(),
            tag);
}

}  // namespace e2e
