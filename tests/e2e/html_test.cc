// explain --html (docs/cli.md, "explain"): the page rendered in a real headless Chromium (tests/e2e/chromium_page.sh):
// its scripts build the collectives table, sorted as the address asks, and the timeline, one bar per node of the
// program; the screenshot is kept under build/artifacts/ (CI's artifact).
#include <gtest/gtest.h>

#include <regex>

#include "e2e_util.h"

namespace {

using namespace e2e;

/// The rows of the table with id `id` in `dom`, each as its cells' text joined by " | ".
std::vector<std::string> table_rows(const std::string& dom, const std::string& id) {
  const size_t at = dom.find("<table id=\"" + id + "\"");
  const size_t body = dom.find("<tbody>", at), end = dom.find("</tbody>", body);
  std::vector<std::string> rows;
  if (at == std::string::npos || body == std::string::npos || end == std::string::npos) return rows;
  const std::string text = dom.substr(body, end - body);
  static const std::regex row("<tr>(.*?)</tr>"), cell("<td[^>]*>(.*?)</td>");
  for (auto r = std::sregex_iterator(text.begin(), text.end(), row); r != std::sregex_iterator(); ++r) {
    const std::string cells = (*r)[1];
    std::string line;
    for (auto c = std::sregex_iterator(cells.begin(), cells.end(), cell); c != std::sregex_iterator(); ++c)
      line += (line.empty() ? "" : " | ") + (*c)[1].str();
    rows.push_back(line);
  }
  return rows;
}

TEST(Html, RendersInChromiumSortedWithTheTimeline) {
  const fs::path d = scratch("html");
  const std::string args =
      "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.paper2d.sharding.json";
  const CmdResult e = cli("explain " + args + " --html " + (d / "gpt.html").string(), "html_explain");
  ASSERT_EQ(e.code, 0) << e.err;
  const auto [s, rep] = cli_report("simulate " + args + " --trace " + (d / "trace.json").string(), d, "html_sim");
  ASSERT_FALSE(rep.is_null());
  size_t spans = 0;
  const nlohmann::json trace = read_json(d / "trace.json");
  for (const auto& ev : trace["traceEvents"]) spans += ev["ph"] == "X";

  const fs::path png = fs::path(GSPMD_BINARY_DIR) / "artifacts" / "explain-gpt-paper2d.png";
  fs::create_directories(png.parent_path());
  fs::remove(png);
  const CmdResult r =
      sh("tests/e2e/chromium_page.sh 'file://" + (d / "gpt.html").string() + "#sort=bytes' " + png.string(),
         "html_chromium");
  ASSERT_EQ(r.code, 0) << "headless chromium (apt-get install chromium; .ci/setup does): " << r.err;
  // The table the page's script built, sorted by bytes, largest first: the logits' all-reduce (8 x 64 x 512 floats
  // over data = 2: 512 KiB per device), whose origin is the LM head's contraction.
  const std::vector<std::string> rows = table_rows(r.out, "collectives");
  ASSERT_EQ(rows.size(), rep["collectives"].size()) << r.out.substr(0, 4000);
  EXPECT_EQ(rows[0],
            "all-reduce | model | 524288 | 1 | 8.316 | (graph output) | logits | model from /lm_head/MatMul (MatMul), "
            "which reduces over dim 2 of '/ln_f/LayerNormalization_output_0', split over model (by no annotation: a "
            "layout the partitioner chose) | 'logits' is unreduced over {model}; graph output");
  int64_t last = INT64_MAX;
  for (const std::string& row : rows) {
    const int64_t bytes = std::stoll(row.substr(row.find(" | ", row.find(" | ") + 3) + 3));
    EXPECT_LE(bytes, last) << row;
    last = bytes;
  }
  // The timeline: one bar per node of the simulated step, as the trace has them.
  size_t rects = 0;
  for (size_t at = 0; (at = r.out.find("<rect ", at)) != std::string::npos; ++at) ++rects;
  EXPECT_GT(spans, 0u);
  EXPECT_EQ(rects, spans);
  // The mesh, and a value's shards with their index ranges.
  EXPECT_NE(r.out.find("<table class=\"mesh\"><tbody><tr><td>0</td><td>1</td></tr><tr><td>2</td><td>3</td></tr>"),
            std::string::npos);
  EXPECT_NE(r.out.find("[0:4, :]"), std::string::npos);
  // The screenshot: a PNG of the page.
  const std::string image = read_file(png);
  EXPECT_GT(image.size(), 20000u);
  EXPECT_EQ(image.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(Html, RefusesAPathItCannotWrite) {
  const CmdResult r =
      cli("explain testdata/gpt/gpt_opset17.onnx --mesh 2x2 --html /nonexistent-dir/page.html", "html_bad_path");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --html: /nonexistent-dir/page.html: no such directory\n");
}

}  // namespace
