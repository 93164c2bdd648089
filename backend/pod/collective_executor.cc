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
  if (call.op == "AllReduce") return pod::all_reduce(ins, call.reduction);
  if (call.op == "AllGather") return pod::all_gather(ins, call.axis);
  if (call.op == "ReduceScatter") return pod::reduce_scatter(ins, call.axis, call.reduction);
  if (call.op == "AllToAll") return pod::all_to_all(ins, call.split_axis, call.concat_axis);
  if (call.op == "CollectivePermute") return pod::collective_permute(ins, call.sources);
  throw std::runtime_error(fmt::format("unknown collective '{}'", call.op));
}

}  // namespace gspmd
