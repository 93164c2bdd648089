// Run under `mpirun -np 4` (ctest: mpi_collectives): every `gspmd` collective through MpiCollectives equals the
// emulator's in-process one (backend/pod/collectives.h), on a 2x2 mesh, over every set of mesh axes ({0}, {1},
// {0,1}, {1,0}), for several dtypes, axes and reductions. Every rank builds all devices' operands (deterministic from
// the device id), computes the in-process results for its group, and compares them with what MPI gave it.
// Prints one line per failure and a summary on rank 0; exits 1 when any rank saw a difference.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/mpi/mpi_backend.h"
#include "backend/pod/collective_executor.h"
#include "core/partition/reshard.h"

using namespace gspmd;

namespace {

Tensor operand(DType t, const Shape& s, int64_t device, int salt) {
  Tensor x(t, s);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t v = (device * 7 + i * 3 + salt) % 11 - 5;
    switch (t) {
      case DType::kFloat32: x.data<float>()[i] = 0.25f * static_cast<float>(v); break;
      case DType::kFloat64: x.data<double>()[i] = 0.125 * static_cast<double>(v); break;
      case DType::kInt64: x.data<int64_t>()[i] = v; break;
      case DType::kInt32: x.data<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kBool: x.data<uint8_t>()[i] = v > 0; break;
      default: break;
    }
  }
  return x;
}

Node collective_node(const std::string& op, const std::vector<int>& axes) {
  Node n;
  n.name = op;
  n.op_type = op;
  n.domain = kGspmdDomain;
  n.attrs["mesh_axes"] = std::vector<int64_t>(axes.begin(), axes.end());
  return n;
}

}  // namespace

int main() {
  mpi::Session session;
  DeviceMesh mesh;
  mesh.shape = {2, 2};
  mesh.axes = {"x", "y"};
  const int rank = session.rank();
  if (session.size() != 4) {
    if (rank == 0) std::fprintf(stderr, "error: run with mpirun -np 4\n");
    return 2;
  }
  const std::vector<std::vector<int>> axis_sets = {{0}, {1}, {0, 1}, {1, 0}};
  Graph prog;  // only its collectives' mesh_axes matter to MpiCollectives
  for (const auto& axes : axis_sets) prog.nodes.push_back(collective_node("AllReduce", axes));
  mpi::MpiCollectives coll(mesh, rank, prog);
  InProcessCollectives ref;
  int failures = 0, checks = 0;

  auto run_case = [&](const std::string& what, CollectiveCall call, DType t, const Shape& s, int salt) {
    const auto groups = mesh.replica_groups(call.mesh_axes);
    for (const auto& g : groups) {
      int64_t tile = -1;
      for (size_t k = 0; k < g.size(); ++k)
        if (g[k] == rank) tile = static_cast<int64_t>(k);
      if (tile < 0) continue;
      call.group = &g;
      std::vector<Tensor> xs;
      for (int64_t d : g) xs.push_back(operand(t, s, d, salt));
      std::vector<const Tensor*> all;
      for (const Tensor& x : xs) all.push_back(&x);
      std::vector<int64_t> members;
      for (size_t k = 0; k < g.size(); ++k) members.push_back(static_cast<int64_t>(k));
      std::vector<Tensor> want = ref.run(call, members, all);
      std::vector<Tensor> got = coll.run(call, {tile}, {all[static_cast<size_t>(tile)]});
      ++checks;
      const Tensor& w = want[static_cast<size_t>(tile)];
      if (got.size() != 1 || got[0].dtype != w.dtype || got[0].shape != w.shape || got[0].bytes != w.bytes) {
        ++failures;
        std::fprintf(stderr, "rank %d: %s over axes {%s} %s%s: differs from the in-process result (got %s)\n", rank,
                     what.c_str(),
                     call.mesh_axes.size() == 2 ? (call.mesh_axes[0] ? "1,0" : "0,1")
                                                : std::to_string(call.mesh_axes[0]).c_str(),
                     std::string(dtype_name(t)).c_str(), shape_str(s).c_str(),
                     got.empty() ? "nothing" : shape_str(got[0].shape).c_str());
      }
    }
  };

  for (const auto& axes : axis_sets) {
    const int64_t n = mesh.num_devices() / (axes.size() == 2 ? 1 : 2);
    CollectiveCall c;
    c.mesh_axes = axes;
    c.op = Collective::kAllReduce;
    for (ReductionKind k : {ReductionKind::kSum, ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd}) {
      c.reduction = k;
      for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kInt32, DType::kBool})
        run_case("AllReduce " + std::string(reduction_name(k)), c, t, {3, 5}, 1);
    }
    c.op = Collective::kAllGather;
    for (int64_t axis : {0, 1, 2, -1}) {
      c.axis = axis;
      run_case("AllGather axis " + std::to_string(axis), c, DType::kFloat32, {2, 3, 5}, 2);
      run_case("AllGather axis " + std::to_string(axis), c, DType::kInt64, {2, 3, 5}, 2);
    }
    c.op = Collective::kReduceScatter;
    c.reduction = ReductionKind::kSum;
    for (int64_t axis : {0, 1, 2}) {
      c.axis = axis;
      Shape s = {3, 5, 7};
      s[static_cast<size_t>(axis)] = 2 * n;
      run_case("ReduceScatter axis " + std::to_string(axis), c, DType::kFloat32, s, 3);
      c.reduction = ReductionKind::kMax;
      run_case("ReduceScatter max axis " + std::to_string(axis), c, DType::kInt32, s, 3);
      c.reduction = ReductionKind::kSum;
    }
    c.op = Collective::kAllToAll;
    for (int64_t sa : {0, 1, 2})
      for (int64_t ca : {0, 1, 2}) {
        c.split_axis = sa;
        c.concat_axis = ca;
        Shape s = {3, 5, 2};
        s[static_cast<size_t>(sa)] = n * (sa + 1);
        run_case("AllToAll split " + std::to_string(sa) + " concat " + std::to_string(ca), c, DType::kFloat32, s, 4);
      }
    c.op = Collective::kCollectivePermute;
    for (int64_t shift : {1, -1, 2}) {
      c.sources = permute_sources(mesh, axes, shift, {});
      run_case("CollectivePermute shift " + std::to_string(shift), c, DType::kFloat32, {4, 3}, 5);
    }
    if (axes.size() == 2) {  // reshard [x,y] <-> [y,x]
      std::vector<int> target = {axes[1], axes[0]};
      c.sources = permute_sources(mesh, axes, 0, target);
      run_case("CollectivePermute target_axes", c, DType::kFloat32, {4, 3}, 6);
    }
  }
  int total = 0, total_checks = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &total_checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("mpi collectives: %d checks on 4 ranks, %d differ from the in-process collectives\n", total_checks,
                total);
  return total == 0 ? 0 : 1;
}
