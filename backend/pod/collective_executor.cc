// backend/pod: InProcessCollectives, the emulator's CollectiveExecutor (collective_executor.h).
#include "backend/pod/collective_executor.h"
#include "core/ir/ir.h"

#include <fmt/format.h>

#include "backend/pod/collectives.h"

namespace gspmd {

std::vector<Tensor> InProcessCollectives::run(const CollectiveCall& call, const std::vector<int64_t>& members,
                                              const std::vector<const Tensor*>& ins) {
  if (!call.group || members.size() != call.group->size() || ins.size() != members.size())
    throw InternalError(fmt::format("in-process collective: {} of {} group members are in this process", members.size(),
                                    call.group ? call.group->size() : 0));
  switch (call.op) {
    case Collective::kAllReduce: return pod::all_reduce(ins, call.reduction);
    case Collective::kAllGather: return pod::all_gather(ins, call.axis);
    case Collective::kReduceScatter: return pod::reduce_scatter(ins, call.axis, call.reduction);
    case Collective::kAllToAll: return pod::all_to_all(ins, call.split_axis, call.concat_axis);
    case Collective::kCollectivePermute: return pod::collective_permute(ins, call.sources);
  }
  throw InternalError("in-process collective: invalid Collective");
}

ThreadCollectives::ThreadCollectives(int64_t devices) : calls_(static_cast<size_t>(devices), 0) {}

std::vector<Tensor> ThreadCollectives::run(const CollectiveCall& call, const std::vector<int64_t>& members,
                                           const std::vector<const Tensor*>& ins) {
  const std::vector<int64_t>& group = *call.group;
  const int64_t tile = members.at(0), device = group.at(static_cast<size_t>(tile));
  std::unique_lock<std::mutex> lock(mu_);
  Slot& s = slots_[{calls_[static_cast<size_t>(device)]++, group[0]}];
  if (s.ins.empty()) s.ins.resize(group.size());
  s.ins[static_cast<size_t>(tile)] = *ins.at(0);
  if (++s.arrived == group.size()) {
    std::vector<int64_t> all;
    std::vector<const Tensor*> ptrs;
    for (size_t t = 0; t < group.size(); ++t) {
      all.push_back(static_cast<int64_t>(t));
      ptrs.push_back(&s.ins[t]);
    }
    try {
      s.outs = InProcessCollectives().run(call, all, ptrs);
    } catch (...) {
      failed_ = std::current_exception();
    }
    s.done = true;
    cv_.notify_all();
  }
  cv_.wait(lock, [&] { return s.done || failed_; });
  if (failed_) std::rethrow_exception(failed_);
  return {s.outs.at(static_cast<size_t>(tile))};
}

void ThreadCollectives::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) failed_ = e;
  cv_.notify_all();
}

}  // namespace gspmd
