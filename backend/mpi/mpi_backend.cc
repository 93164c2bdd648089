// backend/mpi: Session and MpiCollectives (mpi_backend.h); run_mpi in mpi_run.cc.
#include "backend/mpi/mpi_backend.h"

#include <mpi.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "backend/mpi/mpi_check.h"
#include "backend/pod/collectives.h"

namespace gspmd::mpi {
namespace {

// The line the signal handler writes; formatted before the handler is installed (write() is async-signal-safe).
char g_term_msg[256];
volatile sig_atomic_t g_term_code = 2;

extern "C" void on_terminate(int) {
  if (g_term_msg[0]) {
    ssize_t r = ::write(STDERR_FILENO, g_term_msg, std::strlen(g_term_msg));
    (void)r;
  }
  // give mpirun's output forwarding time to read the line before the process goes away
  struct timespec t = {0, 200 * 1000 * 1000};
  ::nanosleep(&t, nullptr);
  ::_exit(g_term_code);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kUInt16: return MPI_UINT16_T;
    case DType::kUInt32: return MPI_UINT32_T;
    case DType::kUInt64: return MPI_UINT64_T;
    case DType::kBool: return MPI_UNSIGNED_CHAR;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReductionKind k, DType t) {
  if (t == DType::kBool)  // sum/max = or, min/prod = and (as the pod)
    return k == ReductionKind::kSum || k == ReductionKind::kMax ? MPI_LOR : MPI_LAND;
  switch (k) {
    case ReductionKind::kSum: return MPI_SUM;
    case ReductionKind::kMax: return MPI_MAX;
    case ReductionKind::kMin: return MPI_MIN;
    case ReductionKind::kProd: return MPI_PROD;
  }
  return MPI_SUM;
}

MPI_Datatype reduction_type(const Tensor& x, ReductionKind k) {
  MPI_Datatype t = mpi_type(x.dtype);
  if (t == MPI_DATATYPE_NULL)
    throw UnsupportedError(
        fmt::format("{} reduction of {} is not supported by the mpi backend", reduction_name(k), dtype_name(x.dtype)));
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------- Session

Session::Session() {
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) throw InternalError("MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  std::snprintf(g_term_msg, sizeof g_term_msg,
                "error: rank %d: terminated by mpirun (another rank failed or was killed; see its message)\n", rank_);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_terminate;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

Session::~Session() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

namespace {
void wait_without_spinning(MPI_Request* req, const char* what) {
  for (int done = 0;;) {
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) throw InternalError(fmt::format("{} failed", what));
    if (done) return;
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, nullptr);
  }
}
}  // namespace

std::string Session::broadcast(const std::string& text) const {
  uint64_t n = text.size();
  MPI_Request req;
  if (MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS) throw InternalError("MPI_Ibcast failed");
  wait_without_spinning(&req, "MPI_Ibcast");
  if (n > static_cast<uint64_t>(INT_MAX)) throw UnsupportedError("Session::broadcast: text over INT_MAX bytes");
  std::string out = rank_ == 0 ? text : std::string(n, '\0');
  if (n == 0) return out;
  if (MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    throw InternalError("MPI_Ibcast failed");
  wait_without_spinning(&req, "MPI_Ibcast");
  return out;
}

int Session::ranks_on_this_host() const {
  MPI_Comm local;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local) != MPI_SUCCESS)
    throw InternalError("MPI_Comm_split_type failed");
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return std::max(n, 1);
}

void Session::agree(const std::optional<Failure>& mine) const {
  constexpr size_t kMsg = 1024;
  struct Slot {
    int32_t code;
    char msg[kMsg];
  };
  Slot me{};
  if (mine) {
    me.code = mine->exit_code ? mine->exit_code : 4;
    std::strncpy(me.msg, mine->message.c_str(), kMsg - 1);
  }
  std::vector<Slot> all(static_cast<size_t>(size_));
  check(MPI_Allgather(&me, sizeof(Slot), MPI_BYTE, all.data(), sizeof(Slot), MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgather (setup status)");
  if (me.code) throw RankFailure(me.code, fmt::format("rank {}: {}", rank_, me.msg));
  for (int r = 0; r < size_; ++r)
    if (all[r].code) throw RankFailure(all[r].code, fmt::format("rank {}: rank {} failed: {}", rank_, r, all[r].msg));
}

void Session::exiting_with_error(int code) const {
  g_term_msg[0] = '\0';
  g_term_code = code;
}

void Session::abort(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---------------------------------------------------------------------------------------------- MpiCollectives

struct MpiCollectives::Comm {
  std::vector<int> axes;
  MPI_Comm comm = MPI_COMM_NULL;
  int size = 1;
  int tile = 0;
};

MpiCollectives::MpiCollectives(const DeviceMesh& mesh, int rank, const Graph& program) : mesh_(mesh), rank_(rank) {
  for (const Node& n : program.nodes) {
    if (!is_collective(n)) continue;
    const std::vector<int> axes = mesh_axes_attr(n);
    for (int a : axes)
      if (a >= mesh.rank())
        throw InternalError(fmt::format("node '{}': mesh axis {} out of range for mesh {}", n.name, a, mesh.str()));
    bool known = false;
    for (const Comm* c : comms_) known |= c->axes == axes;
    if (known) continue;
    auto groups = mesh.replica_groups(axes);
    int color = -1;
    for (size_t g = 0; g < groups.size(); ++g)
      if (std::find(groups[g].begin(), groups[g].end(), rank) != groups[g].end()) color = static_cast<int>(g);
    if (color < 0) throw InternalError(fmt::format("rank {} is not a device of the mesh {}", rank, mesh.str()));
    auto c = std::make_unique<Comm>();
    c->axes = axes;
    c->tile = static_cast<int>(mesh.tile_index(rank, axes));
    check(MPI_Comm_split(MPI_COMM_WORLD, color, c->tile, &c->comm), "MPI_Comm_split");
    MPI_Comm_size(c->comm, &c->size);
    int r = -1;
    MPI_Comm_rank(c->comm, &r);
    if (c->size != static_cast<int>(groups[color].size()) || r != c->tile)
      throw InternalError(fmt::format("MPI_Comm_split over {}: got {} ranks (rank {}), expected {} (tile {})",
                                      fmt::join(mesh.axis_names(axes), ","), c->size, r, groups[color].size(),
                                      c->tile));
    comms_.push_back(c.release());
  }
}

MpiCollectives::~MpiCollectives() {
  for (Comm* c : comms_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    delete c;
  }
}

const MpiCollectives::Comm& MpiCollectives::comm(const std::vector<int>& mesh_axes) const {
  for (const Comm* c : comms_)
    if (c->axes == mesh_axes) return *c;
  throw InternalError(
      fmt::format("no communicator over mesh axes {} (not in the program given at setup)", fmt::join(mesh_axes, ",")));
}

std::vector<Tensor> MpiCollectives::run(const CollectiveCall& call, const std::vector<int64_t>& members,
                                        const std::vector<const Tensor*>& ins) {
  if (!call.group || members.size() != 1 || ins.size() != 1 || !ins[0] ||
      (*call.group)[static_cast<size_t>(members[0])] != rank_)
    throw InternalError(fmt::format("mpi collective: rank {} must hold exactly its own member", rank_));
  const Comm& c = comm(call.mesh_axes);
  if (c.tile != members[0] || c.size != static_cast<int>(call.group->size()))
    throw InternalError(fmt::format("mpi collective: rank {} is tile {} of {} but the group says {} of {}", rank_,
                                    c.tile, c.size, members[0], call.group->size()));
  const Tensor& x = *ins[0];
  const int n = c.size;
  const size_t nb = x.nbytes();
  std::vector<Tensor> out(1);
  switch (call.op) {
    case Collective::kAllReduce: {
      MPI_Datatype t = reduction_type(x, call.reduction);
      out[0] = x;
      check(MPI_Allreduce(MPI_IN_PLACE, out[0].bytes.data(), count_of(static_cast<size_t>(x.numel()), "MPI_Allreduce"),
                          t, mpi_op(call.reduction, x.dtype), c.comm),
            "MPI_Allreduce");
      break;
    }
    case Collective::kAllGather: {
      int64_t a = pod::norm_axis(call.axis, x.shape.size(), "all-gather axis");
      Shape s = x.shape;
      s[a] *= n;
      Tensor y(x.dtype, s);
      std::vector<std::byte> buf(nb * static_cast<size_t>(n));
      check(MPI_Allgather(x.bytes.data(), count_of(nb, "MPI_Allgather"), MPI_BYTE, buf.data(), static_cast<int>(nb),
                          MPI_BYTE, c.comm),
            "MPI_Allgather");
      pod::unpack_chunks(buf, y, a, n);
      out[0] = std::move(y);
      break;
    }
    case Collective::kReduceScatter: {
      int64_t a = pod::norm_axis(call.axis, x.shape.size(), "reduce-scatter axis");
      if (x.shape[a] % n != 0)
        throw InternalError(fmt::format("reduce-scatter: dim {} of {} is not divisible by the group size {}", a,
                                        shape_str(x.shape), n));
      MPI_Datatype t = reduction_type(x, call.reduction);
      std::vector<std::byte> packed = pod::pack_chunks(x, a, n);
      Shape s = x.shape;
      s[a] /= n;
      Tensor y(x.dtype, s);
      std::vector<int> counts(static_cast<size_t>(n), count_of(static_cast<size_t>(y.numel()), "MPI_Reduce_scatter"));
      check(
          MPI_Reduce_scatter(packed.data(), y.bytes.data(), counts.data(), t, mpi_op(call.reduction, x.dtype), c.comm),
          "MPI_Reduce_scatter");
      out[0] = std::move(y);
      break;
    }
    case Collective::kAllToAll: {
      int64_t sa = pod::norm_axis(call.split_axis, x.shape.size(), "all-to-all split_axis");
      int64_t ca = pod::norm_axis(call.concat_axis, x.shape.size(), "all-to-all concat_axis");
      if (x.shape[sa] % n != 0)
        throw InternalError(
            fmt::format("all-to-all: dim {} of {} is not divisible by the group size {}", sa, shape_str(x.shape), n));
      std::vector<std::byte> packed = pod::pack_chunks(x, sa, n);
      std::vector<std::byte> recv(nb);
      const size_t chunk = nb / static_cast<size_t>(n);
      check(MPI_Alltoall(packed.data(), count_of(chunk, "MPI_Alltoall"), MPI_BYTE, recv.data(), static_cast<int>(chunk),
                         MPI_BYTE, c.comm),
            "MPI_Alltoall");
      Shape s = x.shape;
      s[sa] /= n;
      s[ca] *= n;
      Tensor y(x.dtype, s);
      pod::unpack_chunks(recv, y, ca, n);
      out[0] = std::move(y);
      break;
    }
    case Collective::kCollectivePermute: {
      if (call.sources.size() != static_cast<size_t>(n))
        throw InternalError(fmt::format("collective-permute: {} sources for a group of {}", call.sources.size(), n));
      const int me = c.tile;
      const int64_t src = call.sources[static_cast<size_t>(me)];
      std::vector<int> dests;
      for (int t = 0; t < n; ++t)
        if (call.sources[static_cast<size_t>(t)] == me) dests.push_back(t);
      Tensor y(x.dtype, x.shape);  // zeros when there is no source
      const int cnt = count_of(nb, "MPI_Sendrecv");
      const int from = src >= 0 && src < n ? static_cast<int>(src) : MPI_PROC_NULL;
      if (dests.size() <= 1) {
        const int to = dests.empty() ? MPI_PROC_NULL : dests[0];
        check(MPI_Sendrecv(x.bytes.data(), cnt, MPI_BYTE, to, 0, y.bytes.data(), cnt, MPI_BYTE, from, 0, c.comm,
                           MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
      } else {  // one source feeding several members: post the sends, then receive
        std::vector<MPI_Request> reqs(dests.size());
        for (size_t i = 0; i < dests.size(); ++i)
          check(MPI_Isend(x.bytes.data(), cnt, MPI_BYTE, dests[i], 0, c.comm, &reqs[i]), "MPI_Isend");
        check(MPI_Recv(y.bytes.data(), cnt, MPI_BYTE, from, 0, c.comm, MPI_STATUS_IGNORE), "MPI_Recv");
        check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      }
      out[0] = std::move(y);
      break;
    }
  }
  return out;
}

}  // namespace gspmd::mpi
