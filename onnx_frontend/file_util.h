// onnx_frontend internal: file and message helpers (no ONNX headers, so sharding_file.cc stays light).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "onnx_frontend/frontend.h"

namespace gspmd::frontend {

/// Whole file as bytes, of a regular file only; throws InputError("PATH: cannot open file") when it is missing, a
/// directory or unreadable, InputError("PATH: not a regular file (a FIFO, socket or device)") for anything else
/// (reading a FIFO would wait for a writer forever).
std::string read_file(const std::string& path);
/// Writes `bytes` to `path` through a temp file in the same directory + rename (all or nothing).
/// Throws InputError("PATH: cannot write file: <errno text>"): a path the user gave that cannot be written.
void write_file_atomic(const std::string& path, const std::string& bytes);
/// Directory part of a path ("" -> ".").
std::string dir_of(const std::string& path);

/// "2x2" for mesh shape {2, 2}, as --mesh takes it.
inline std::string mesh_shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("{}", fmt::join(shape, "x"));
}

/// `text` for a one-line message: control characters and bytes from 0x7f up as \xNN (a name that is not UTF-8, a
/// location with a NUL), cut to 60 characters (cut_text).
inline std::string shown_bytes(std::string_view text) {
  std::string shown;
  for (unsigned char c : text)
    shown += c < 0x20 || c >= 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, static_cast<char>(c));
  return cut_text(shown);
}

/// "1 tensor", "3 tensors".
inline std::string count_str(size_t n, const char* noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }
/// structure_str with its article: "a sequence", "an optional(tensor)" (structured_io.cc).
std::string with_article(const ValueStructure& s);

}  // namespace gspmd::frontend
