// Progress lines on a terminal (cli/progress.h).
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace gspmd::cli {

bool stderr_is_terminal(bool launched) {
  if (::isatty(STDERR_FILENO)) return true;
  if (!launched) return false;
  char target[256] = {};
  const std::string fd = fmt::format("/proc/{}/fd/2", ::getppid());
  const ssize_t n = ::readlink(fd.c_str(), target, sizeof target - 1);
  const std::string_view t(target, n > 0 ? static_cast<size_t>(n) : 0);
  return t.starts_with("/dev/pts/") || t.starts_with("/dev/tty");
}

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {
  if (const char* env = std::getenv("GSPMD_PROGRESS_DELAY_MS")) delay_ = std::chrono::milliseconds(std::atoll(env));
}

void ProgressLine::update(const std::function<std::string()>& text) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < delay_ || (shown_ && now - last_ < std::chrono::milliseconds(100))) return;
  last_ = now;
  shown_ = true;
  fmt::print(stderr, "\r{}\033[K", text());
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (!shown_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

RunProgress node_progress(std::string label, bool enabled) {
  auto line = std::make_shared<ProgressLine>(enabled);
  if (!line->enabled()) return {};
  return [line, label = std::move(label)](size_t done, size_t total) {
    if (done >= total) return line->finish();
    line->update([&] { return fmt::format("{}, node {}/{} ({}%)", label, done, total, 100 * done / total); });
  };
}

std::function<void(const AutoProgress&)> auto_progress(bool enabled) {
  auto line = std::make_shared<ProgressLine>(enabled);
  if (!line->enabled()) return {};
  return [line](const AutoProgress& p) {
    if (p.done) return line->finish();
    line->update([&] {
      const std::string where =
          p.descent == 0 ? std::string("costing the seeds")
                         : fmt::format("descent {} sweep {} group {}/{}", p.descent, p.sweep, p.group, p.groups);
      const std::string best =
          p.best_step_time_s > 0 ? fmt::format(", best step {:.3f} ms", 1e3 * p.best_step_time_s) : "";
      return fmt::format("auto: {} plan{}, {}{}, {:.0f} s", p.evaluations, p.evaluations == 1 ? "" : "s", where, best,
                         p.elapsed_s);
    });
  };
}

}  // namespace gspmd::cli
