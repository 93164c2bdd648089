// backend/pod: InProcessCollectives, the emulator's CollectiveExecutor (collective_executor.h).
#include "backend/pod/collective_executor.h"

#include <fmt/format.h>

#include "backend/pod/collectives.h"

namespace gspmd {

std::vector<Tensor> InProcessCollectives::run(const CollectiveCall& call, const std::vector<int64_t>& members,
                                              const std::vector<const Tensor*>& ins) {
  if (!call.group || members.size() != call.group->size() || ins.size() != members.size())
    throw std::runtime_error(fmt::format("in-process collective: {} of {} group members are in this process",
                                         members.size(), call.group ? call.group->size() : 0));
  switch (call.op) {
    case Collective::kAllReduce: return pod::all_reduce(ins, call.reduction);
    case Collective::kAllGather: return pod::all_gather(ins, call.axis);
    case Collective::kReduceScatter: return pod::reduce_scatter(ins, call.axis, call.reduction);
    case Collective::kAllToAll: return pod::all_to_all(ins, call.split_axis, call.concat_axis);
    case Collective::kCollectivePermute: return pod::collective_permute(ins, call.sources);
  }
  throw std::logic_error("in-process collective: invalid Collective");
}

}  // namespace gspmd
