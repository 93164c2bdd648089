// cli/progress.h: progress of long work on stderr, shown only when stderr is a terminal (docs/cli.md, "Progress").
// The library reports progress through callbacks (RunProgress in backend/pod/pod.h, AutoOptions::progress in
// core/auto/auto.h) and prints nothing; these render them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "backend/pod/pod.h"
#include "core/auto/auto.h"

namespace gspmd::cli {

/// True when what this process writes to stderr reaches a terminal: stderr is one, or, for a rank started by mpirun
/// (`launched`), whose stderr is a pipe to the launcher, the stderr of its parent process (mpirun on the launching
/// host, read from /proc) is one.
bool stderr_is_terminal(bool launched = false);

/// One status line on stderr, rewritten in place ("\r...\033[K"). It appears only when `enabled` (by default: stderr
/// is a terminal) and the work has taken longer than the delay (GSPMD_PROGRESS_DELAY_MS, default 1000 ms), is
/// rewritten at most 10 times a second, and is erased by finish(). Display only: it never changes what a command
/// computes or writes.
class ProgressLine {
 public:
  /// A line for work that starts now; disabled (every call does nothing) unless `enabled`.
  explicit ProgressLine(bool enabled = stderr_is_terminal());
  /// Erases the line (finish()), so that an error printed next starts on a clean line.
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  /// Shows text() when the line is due (the delay has passed and 100 ms since the last update); `text` is called
  /// only then.
  void update(const std::function<std::string()>& text);
  /// Erases the line if it was shown; a later update() shows it again.
  void finish();
  /// False when stderr is not a terminal: nothing will ever be shown.
  bool enabled() const { return enabled_; }

 private:
  bool enabled_ = false;
  bool shown_ = false;
  std::chrono::milliseconds delay_{1000};
  std::chrono::steady_clock::time_point start_, last_{};
};

/// A RunProgress that shows "<label>, node 120/480 (25%)" (e.g. "run: 16 devices") and erases it at the last node;
/// empty when stderr is not a terminal.
RunProgress node_progress(std::string label, bool enabled = stderr_is_terminal());

/// An AutoOptions::progress that shows "auto: 153 plans, descent 1 sweep 2 group 14/40, best step 1.234 ms, 12 s"
/// ("auto: 1 plan, costing the seeds, 0 s" before the descent) and erases it when the search is done; empty when
/// stderr is not a terminal.
std::function<void(const AutoProgress&)> auto_progress(bool enabled = stderr_is_terminal());

}  // namespace gspmd::cli
