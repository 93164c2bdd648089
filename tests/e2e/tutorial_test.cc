// docs/tutorial.md runs as written: its Python block is testdata/tools/export_tutorial_mlp.py; its shell blocks run in
// order in one empty folder (the binary and Debian's python3 first on PATH), each exiting 0; and every line of the
// text block after a shell block is a line of that block's output (a line ending in "..." a prefix; "..." skips).
#include <gtest/gtest.h>

#include <fstream>

#include "e2e_util.h"

namespace {

using namespace e2e;

struct Block {
  std::string lang, text;
};

/// The fenced code blocks of a markdown file, in order.
std::vector<Block> code_blocks(const std::string& md) {
  std::vector<Block> out;
  std::istringstream in(md);
  std::optional<Block> cur;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("```")) {
      if (cur) {
        out.push_back(std::move(*cur));
        cur.reset();
      } else {
        cur = Block{line.substr(3), ""};
      }
    } else if (cur) {
      cur->text += line + "\n";
    }
  }
  return out;
}

/// The lines of `expected` that `output` lacks (as whole lines; "x ..." a prefix; "..." skipped).
std::string missing_lines(const std::string& expected, const std::string& output) {
  std::vector<std::string> got;
  std::istringstream o(output);
  for (std::string line; std::getline(o, line);) got.push_back(line);
  std::string missing;
  std::istringstream e(expected);
  for (std::string want; std::getline(e, want);) {
    if (want == "...") continue;
    const bool prefix = want.ends_with(" ...");
    const std::string head = prefix ? want.substr(0, want.size() - 3) : want;
    const bool found = std::any_of(got.begin(), got.end(), [&](const std::string& line) {
      return prefix ? line.starts_with(head) : line == want;
    });
    if (!found) missing += want + "\n";
  }
  return missing;
}

TEST(Tutorial, EveryCommandRunsAndPrintsWhatThePageShows) {
  const std::vector<Block> blocks = code_blocks(read_file(fs::path(GSPMD_SOURCE_DIR) / "docs" / "tutorial.md"));
  const fs::path d = scratch("tutorial");
  fs::create_directories(d / "bin");
  fs::create_symlink(debian_python(), d / "bin" / "python3");
  int commands = 0, checked = 0;
  std::string last_output;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    if (b.lang == "python") {
      EXPECT_EQ(b.text, read_file(fs::path(GSPMD_SOURCE_DIR) / "testdata" / "tools" / "export_tutorial_mlp.py"))
          << "the tutorial's Python is not testdata/tools/export_tutorial_mlp.py";
      std::ofstream(d / "export_mlp.py") << b.text;
    } else if (b.lang == "sh") {
      std::ofstream(d / "step.sh") << b.text;
      const CmdResult r = sh("cd " + d.string() + " && PATH=" + (d / "bin").string() + ":" + GSPMD_BINARY_DIR +
                                 "/bin:$PATH bash -eo pipefail step.sh",
                             "tutorial_" + std::to_string(i));
      ASSERT_EQ(r.code, 0) << b.text << "\n" << r.out << r.err;
      last_output = r.out + r.err;
      ++commands;
    } else if (b.lang == "text") {
      ASSERT_GT(commands, 0) << "a text block before any command";
      EXPECT_EQ(missing_lines(b.text, last_output), "") << "after:\n"
                                                        << blocks[i - 1].text << "\noutput:\n"
                                                        << last_output;
      ++checked;
    }
  }
  EXPECT_EQ(commands, 8);
  EXPECT_EQ(checked, 6);
}

}  // namespace
