// onnx_frontend internal: file helpers (no ONNX headers, so sharding_file.cc stays light).
#pragma once

#include <string>

namespace gspmd::frontend {

/// Whole file as bytes; throws InputError("PATH: cannot open file") when it cannot be read.
std::string read_file(const std::string& path);
/// Writes `bytes` to `path` through a temp file in the same directory + rename (all or nothing).
/// Throws std::runtime_error("PATH: cannot write file: <errno text>").
void write_file_atomic(const std::string& path, const std::string& bytes);
/// Directory part of a path ("" -> ".").
std::string dir_of(const std::string& path);

}  // namespace gspmd::frontend
