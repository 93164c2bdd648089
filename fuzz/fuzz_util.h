// fuzz: what the libFuzzer targets share (docs/testing.md, "Fuzzing"): a scratch folder for the input files, and the
// rule that only the documented errors are expected outcomes of bad input.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/ir/ir.h"

namespace gspmd::fuzz {

/// This process's scratch folder, $TMPDIR/gspmd-fuzz-<pid> (created on first use, removed at a normal exit; a crash
/// leaves it for the artifact's reproduction). It holds the input as a file, since the readers take paths as the CLI
/// does, and `weights.bin`, the external data file that models and tensors may name.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const char* tmp = std::getenv("TMPDIR");
      path = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("gspmd-fuzz-" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
      // 128 KiB of external data: bytes 0, 1, ..., 60, 0, 1, ... (finite, modest values in every dtype).
      std::string bytes(128 * 1024, '\0');
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i % 61);
      std::ofstream(path / "weights.bin", std::ios::binary) << bytes;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

/// Writes `text` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_file(const std::string& name, std::string_view text) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  return path;
}

/// The fuzzer's input as a string_view.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Runs `body`, for which the documented errors of bad input (core/ir/ir.h: InputError, UnsupportedError,
/// DataDependentError; docs/errors.md) are expected outcomes: they end the call quietly. Any other exception escapes
/// the fuzz target, and libFuzzer reports it as a crash (std::terminate prints its type and message).
template <class F>
void expect_documented_errors(F&& body) {
  try {
    body();
  } catch (const InputError&) {
  } catch (const UnsupportedError&) {
  } catch (const DataDependentError&) {
  }
}

/// Aborts with `what` on stderr: an oracle of a target failed (libFuzzer reports the abort as a crash).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz oracle failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace gspmd::fuzz
