// ONNX's checker and protobuf classes for the frontend tests that parse exported models back.
// The frontend links onnx privately; its headers need these definitions (the onnx target sets them for its users).
#pragma once

#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace gspmd::test {

/// The ONNX model in `path` (a test failure when it does not parse).
inline onnx::ModelProto read_onnx_model(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in)) << path;
  return m;
}

/// Writes `m` to `path` (a test failure when it cannot).
inline void write_onnx_model(const onnx::ModelProto& m, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  EXPECT_TRUE(m.SerializeToOstream(&out)) << path;
}

}  // namespace gspmd::test
