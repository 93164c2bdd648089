// core/program/program_ops.h: the `gspmd` op set. Names round trip, nodes convert to the enum, attributes read and
// build, and malformed nodes fail with the node's name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <string>

#include "core/program/program_ops.h"

namespace gspmd {
namespace {

using ::testing::HasSubstr;

Node node_of(const std::string& name, const std::string& op, std::map<std::string, AttrValue> attrs,
             const std::string& domain = kGspmdDomain) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.domain = domain;
  n.attrs = std::move(attrs);
  return n;
}

/// Runs `f`, expects an InternalError (or the attribute reader's SpecError) whose message names the node and contains
/// `what`.
template <class F>
void expect_error(F&& f, const std::string& node, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "expected an error naming '" << node << "' with '" << what << "'";
  } catch (const std::exception& e) {
    EXPECT_TRUE(dynamic_cast<const InternalError*>(&e) || dynamic_cast<const SpecError*>(&e)) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("node '" + node + "'"));
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

const std::vector<int64_t> kAxes01{0, 1};

// ---------------------------------------------------------------------------------------------------- names
TEST(ProgramOps, OpNamesRoundTrip) {
  // the ONNX op types are an external contract (docs/collectives.md): spell them out once here
  const std::map<GspmdOp, std::string> want = {{GspmdOp::kAllReduce, "AllReduce"},
                                               {GspmdOp::kAllGather, "AllGather"},
                                               {GspmdOp::kReduceScatter, "ReduceScatter"},
                                               {GspmdOp::kAllToAll, "AllToAll"},
                                               {GspmdOp::kCollectivePermute, "CollectivePermute"},
                                               {GspmdOp::kShardSlice, "ShardSlice"},
                                               {GspmdOp::kMaskPad, "MaskPad"},
                                               {GspmdOp::kPartitionOffset, "PartitionOffset"}};
  ASSERT_EQ(std::size(kAllGspmdOps), want.size());
  std::set<std::string_view> seen;
  for (GspmdOp op : kAllGspmdOps) {
    EXPECT_EQ(op_name(op), want.at(op));
    EXPECT_EQ(gspmd_op_from_name(op_name(op)), op) << op_name(op);
    seen.insert(op_name(op));
  }
  EXPECT_EQ(seen.size(), want.size());
}

TEST(ProgramOps, CollectiveNamesRoundTrip) {
  // the display names are an external contract too (docs/cli.md: the report's "kind", explain, traces)
  const std::map<Collective, std::pair<std::string, std::string>> want = {
      {Collective::kAllReduce, {"all-reduce", "AllReduce"}},
      {Collective::kAllGather, {"all-gather", "AllGather"}},
      {Collective::kReduceScatter, {"reduce-scatter", "ReduceScatter"}},
      {Collective::kAllToAll, {"all-to-all", "AllToAll"}},
      {Collective::kCollectivePermute, {"collective-permute", "CollectivePermute"}}};
  ASSERT_EQ(std::size(kAllCollectives), want.size());
  for (Collective c : kAllCollectives) {
    EXPECT_EQ(collective_name(c), want.at(c).first);
    EXPECT_EQ(collective_from_name(collective_name(c)), c);
    EXPECT_EQ(op_name(c), want.at(c).second);
    EXPECT_EQ(collective_of(gspmd_op_of(c)), c);
    EXPECT_TRUE(is_collective(gspmd_op_of(c)));
    std::ostringstream os;
    os << c;
    EXPECT_EQ(os.str(), want.at(c).first);
  }
  int collectives = 0;
  for (GspmdOp op : kAllGspmdOps) {
    if (std::optional<Collective> c = collective_of(op)) {
      ++collectives;
      EXPECT_EQ(gspmd_op_of(*c), op);
    }
  }
  EXPECT_EQ(collectives, 5);
  for (GspmdOp op : {GspmdOp::kShardSlice, GspmdOp::kMaskPad, GspmdOp::kPartitionOffset}) {
    EXPECT_FALSE(is_collective(op)) << op_name(op);
    EXPECT_EQ(collective_of(op), std::nullopt) << op_name(op);
  }
}

TEST(ProgramOps, UnknownNames) {
  for (const char* s : {"", "Frobnicate", "allreduce", "ALLREDUCE", "all-reduce", "Allreduce", "AllReduce "})
    EXPECT_EQ(gspmd_op_from_name(s), std::nullopt) << "'" << s << "'";
  for (const char* s : {"", "broadcast", "AllReduce", "all_reduce", "All-Reduce", "shard-slice"})
    EXPECT_EQ(collective_from_name(s), std::nullopt) << "'" << s << "'";
}

TEST(ProgramOps, GspmdOpOfNode) {
  EXPECT_EQ(gspmd_op(node_of("m", "MaskPad", {})), GspmdOp::kMaskPad);
  EXPECT_EQ(gspmd_op(node_of("p", "CollectivePermute", {})), GspmdOp::kCollectivePermute);
  // the same op type in another domain is not ours
  for (const char* domain : {"", "ai.onnx", "com.microsoft", "GSPMD"}) {
    const Node n = node_of("ar", "AllReduce", {}, domain);
    EXPECT_EQ(gspmd_op(n), std::nullopt) << domain;
    EXPECT_EQ(collective_of(n), std::nullopt) << domain;
    EXPECT_FALSE(is_collective(n)) << domain;
  }
  // an unknown op in our domain
  EXPECT_EQ(gspmd_op(node_of("f", "Frobnicate", {})), std::nullopt);
  EXPECT_FALSE(is_collective(node_of("f", "Frobnicate", {})));
  // per-device ops are gspmd ops, not collectives
  const Node s = node_of("s", "ShardSlice", {});
  EXPECT_EQ(gspmd_op(s), GspmdOp::kShardSlice);
  EXPECT_EQ(collective_of(s), std::nullopt);
  EXPECT_FALSE(is_collective(s));
  EXPECT_EQ(collective_of(node_of("a", "AllToAll", {})), Collective::kAllToAll);
  EXPECT_TRUE(is_collective(node_of("g", "AllGather", {})));
}

// ---------------------------------------------------------------------------------------------------- attributes
TEST(ProgramOps, CollectiveAttributes) {
  CollectiveAttrs a =
      collective_attrs(node_of("ar", "AllReduce", {{"mesh_axes", kAxes01}, {"reduction", std::string("max")}}));
  EXPECT_EQ(a.kind, Collective::kAllReduce);
  EXPECT_EQ(a.mesh_axes, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.reduction, ReductionKind::kMax);
  // reduction is optional: sum
  EXPECT_EQ(collective_attrs(node_of("ar", "AllReduce", {{"mesh_axes", kAxes01}})).reduction, ReductionKind::kSum);

  a = collective_attrs(node_of("ag", "AllGather", {{"mesh_axes", std::vector<int64_t>{1}}, {"axis", int64_t{-1}}}));
  EXPECT_EQ(a.kind, Collective::kAllGather);
  EXPECT_EQ(a.mesh_axes, (std::vector<int>{1}));
  EXPECT_EQ(a.axis, -1);

  a = collective_attrs(
      node_of("rs", "ReduceScatter",
              {{"mesh_axes", std::vector<int64_t>{}}, {"axis", int64_t{2}}, {"reduction", std::string("prod")}}));
  EXPECT_EQ(a.kind, Collective::kReduceScatter);
  EXPECT_TRUE(a.mesh_axes.empty());
  EXPECT_EQ(a.axis, 2);
  EXPECT_EQ(a.reduction, ReductionKind::kProd);

  a = collective_attrs(
      node_of("a2a", "AllToAll", {{"mesh_axes", kAxes01}, {"split_axis", int64_t{0}}, {"concat_axis", int64_t{1}}}));
  EXPECT_EQ(a.kind, Collective::kAllToAll);
  EXPECT_EQ(a.split_axis, 0);
  EXPECT_EQ(a.concat_axis, 1);

  a = collective_attrs(node_of("halo", "CollectivePermute", {{"mesh_axes", kAxes01}, {"shift", int64_t{-1}}}));
  EXPECT_EQ(a.kind, Collective::kCollectivePermute);
  EXPECT_EQ(a.shift, -1);
  EXPECT_TRUE(a.target_axes.empty());
  a = collective_attrs(
      node_of("swap", "CollectivePermute", {{"mesh_axes", kAxes01}, {"target_axes", std::vector<int64_t>{1, 0}}}));
  EXPECT_EQ(a.shift, 0);
  EXPECT_EQ(a.target_axes, (std::vector<int>{1, 0}));
}

TEST(ProgramOps, PerDeviceAttributes) {
  ShardSliceAttrs s = shard_slice_attrs(
      node_of("s", "ShardSlice", {{"axis", int64_t{1}}, {"mesh_axes", kAxes01}, {"shard_size", int64_t{3}}}));
  EXPECT_EQ(s.axis, 1);
  EXPECT_EQ(s.mesh_axes, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.shard_size, 3);
  EXPECT_EQ(s.base, std::nullopt);
  EXPECT_EQ(s.size, std::nullopt);
  EXPECT_EQ(s.start(2), 6);  // base 0 + 2 * 3
  EXPECT_EQ(s.length(), 3);  // size = shard_size
  s = shard_slice_attrs(node_of("w", "ShardSlice",
                                {{"axis", int64_t{2}},
                                 {"mesh_axes", std::vector<int64_t>{0}},
                                 {"shard_size", int64_t{4}},
                                 {"base", int64_t{-1}},
                                 {"size", int64_t{6}}}));
  EXPECT_EQ(s.base, -1);
  EXPECT_EQ(s.size, 6);
  EXPECT_EQ(s.start(0), -1);
  EXPECT_EQ(s.start(3), 11);
  EXPECT_EQ(s.length(), 6);

  const float ninf = -std::numeric_limits<float>::infinity();
  MaskPadAttrs m = mask_pad_attrs(node_of(
      "m", "MaskPad",
      {{"axis", int64_t{0}}, {"mesh_axes", std::vector<int64_t>{1}}, {"full_size", int64_t{7}}, {"value", ninf}}));
  EXPECT_EQ(m.axis, 0);
  EXPECT_EQ(m.full_size, 7);
  EXPECT_EQ(m.value, ninf);
  EXPECT_EQ(m.first(2, 3), 6);  // base 0, step = the local length 3
  m = mask_pad_attrs(node_of("m", "MaskPad",
                             {{"axis", int64_t{0}},
                              {"mesh_axes", std::vector<int64_t>{1}},
                              {"full_size", int64_t{7}},
                              {"value", 0.f},
                              {"base", int64_t{-2}},
                              {"step", int64_t{4}}}));
  EXPECT_EQ(m.first(2, 3), 6);  // -2 + 2 * 4
  EXPECT_EQ(m.first(0, 3), -2);

  PartitionOffsetAttrs o = partition_offset_attrs(
      node_of("o", "PartitionOffset", {{"mesh_axes", std::vector<int64_t>{0}}, {"shard_size", int64_t{5}}}));
  EXPECT_EQ(o.mesh_axes, (std::vector<int>{0}));
  EXPECT_EQ(o.shard_size, 5);
  EXPECT_EQ(o.offset(3), 15);
}

TEST(ProgramOps, BuildersWriteExactlyTheSetAttributes) {
  auto keys = [](const Node& n) {
    std::vector<std::string> k;
    for (const auto& [name, v] : n.attrs) k.push_back(name);
    return k;
  };
  using K = std::vector<std::string>;
  const CollectiveAttrs cases[] = {
      {.kind = Collective::kAllReduce, .mesh_axes = {0, 1}, .reduction = ReductionKind::kMin},
      {.kind = Collective::kAllGather, .mesh_axes = {1}, .axis = 2},
      {.kind = Collective::kReduceScatter, .mesh_axes = {0}, .reduction = ReductionKind::kSum, .axis = -1},
      {.kind = Collective::kAllToAll, .mesh_axes = {1, 0}, .split_axis = 1, .concat_axis = 0},
      {.kind = Collective::kCollectivePermute, .mesh_axes = {0}, .shift = 1},
      {.kind = Collective::kCollectivePermute, .mesh_axes = {0, 1}, .target_axes = {1, 0}},
  };
  const K want_keys[] = {{"mesh_axes", "reduction"},
                         {"axis", "mesh_axes"},
                         {"axis", "mesh_axes", "reduction"},
                         {"concat_axis", "mesh_axes", "split_axis"},
                         {"mesh_axes", "shift"},
                         {"mesh_axes", "target_axes"}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    const CollectiveAttrs& a = cases[i];
    const Node n = gspmd_node(a);
    EXPECT_EQ(n.domain, kGspmdDomain);
    EXPECT_EQ(n.op_type, op_name(a.kind));
    EXPECT_EQ(keys(n), want_keys[i]) << i;
    const CollectiveAttrs b = collective_attrs(n);
    EXPECT_EQ(b.kind, a.kind) << i;
    EXPECT_EQ(b.mesh_axes, a.mesh_axes) << i;
    EXPECT_EQ(b.reduction, a.reduction) << i;
    EXPECT_EQ(b.axis, a.axis) << i;
    EXPECT_EQ(b.split_axis, a.split_axis) << i;
    EXPECT_EQ(b.concat_axis, a.concat_axis) << i;
    EXPECT_EQ(b.shift, a.shift) << i;
    EXPECT_EQ(b.target_axes, a.target_axes) << i;
  }
  EXPECT_EQ(
      gspmd_node(CollectiveAttrs{.kind = Collective::kAllReduce, .reduction = ReductionKind::kMax}).s("reduction"),
      "max");

  const Node s = gspmd_node(ShardSliceAttrs{.axis = 1, .mesh_axes = {0}, .shard_size = 3});
  EXPECT_EQ(s.op_type, "ShardSlice");
  EXPECT_EQ(keys(s), (K{"axis", "mesh_axes", "shard_size"}));
  const Node sw = gspmd_node(ShardSliceAttrs{.axis = 1, .mesh_axes = {0}, .shard_size = 3, .base = 0, .size = 5});
  EXPECT_EQ(keys(sw), (K{"axis", "base", "mesh_axes", "shard_size", "size"}));
  EXPECT_EQ(shard_slice_attrs(sw).base, 0);
  EXPECT_EQ(shard_slice_attrs(sw).size, 5);

  const Node m = gspmd_node(MaskPadAttrs{.axis = 0, .mesh_axes = {1}, .full_size = 9, .value = 1.f, .step = 4});
  EXPECT_EQ(m.op_type, "MaskPad");
  EXPECT_EQ(keys(m), (K{"axis", "full_size", "mesh_axes", "step", "value"}));
  const MaskPadAttrs mr = mask_pad_attrs(m);
  EXPECT_EQ(mr.full_size, 9);
  EXPECT_EQ(mr.value, 1.f);
  EXPECT_EQ(mr.base, std::nullopt);
  EXPECT_EQ(mr.step, 4);

  const Node o = gspmd_node(PartitionOffsetAttrs{.mesh_axes = {0, 1}, .shard_size = 8});
  EXPECT_EQ(o.op_type, "PartitionOffset");
  EXPECT_EQ(keys(o), (K{"mesh_axes", "shard_size"}));
  EXPECT_EQ(o.ints("mesh_axes"), kAxes01);
  EXPECT_EQ(partition_offset_attrs(o).shard_size, 8);
}

// ---------------------------------------------------------------------------------------------------- errors
TEST(ProgramOps, MissingRequiredAttributesNameTheNode) {
  expect_error([] { collective_attrs(node_of("ar/x", "AllReduce", {})); }, "ar/x", "missing attribute 'mesh_axes'");
  expect_error(
      [] {
        collective_attrs(node_of("ag_3", "AllGather", {{"mesh_axes", kAxes01}}));
      },
      "ag_3", "missing attribute 'axis'");
  expect_error(
      [] {
        collective_attrs(node_of("rs", "ReduceScatter", {{"mesh_axes", kAxes01}}));
      },
      "rs", "missing attribute 'axis'");
  expect_error(
      [] {
        collective_attrs(node_of("a2a", "AllToAll", {{"mesh_axes", kAxes01}, {"split_axis", int64_t{0}}}));
      },
      "a2a", "missing attribute 'concat_axis'");
  expect_error(
      [] {
        collective_attrs(node_of("cp", "CollectivePermute", {{"mesh_axes", kAxes01}}));
      },
      "cp", "missing attribute 'shift' or 'target_axes'");
  expect_error(
      [] {
        shard_slice_attrs(node_of("s", "ShardSlice", {{"axis", int64_t{0}}, {"mesh_axes", kAxes01}}));
      },
      "s", "missing attribute 'shard_size'");
  expect_error(
      [] {
        mask_pad_attrs(node_of("m", "MaskPad", {{"axis", int64_t{0}}, {"mesh_axes", kAxes01}, {"value", 0.f}}));
      },
      "m", "missing attribute 'full_size'");
  expect_error(
      [] {
        mask_pad_attrs(
            node_of("m", "MaskPad", {{"axis", int64_t{0}}, {"mesh_axes", kAxes01}, {"full_size", int64_t{3}}}));
      },
      "m", "missing attribute 'value'");
  expect_error(
      [] {
        partition_offset_attrs(node_of("off", "PartitionOffset", {{"shard_size", int64_t{2}}}));
      },
      "off", "missing attribute 'mesh_axes'");
  expect_error([] { mesh_axes_attr(node_of("n", "AllReduce", {})); }, "n", "missing attribute 'mesh_axes'");
}

TEST(ProgramOps, InvalidAttributesNameTheNode) {
  // wrong attribute type (Node's typed getters)
  expect_error(
      [] {
        collective_attrs(node_of("ag", "AllGather", {{"mesh_axes", kAxes01}, {"axis", 1.5f}}));
      },
      "ag", "attribute 'axis' has the wrong type");
  expect_error(
      [] {
        mesh_axes_attr(node_of("ar", "AllReduce", {{"mesh_axes", int64_t{0}}}));
      },
      "ar", "attribute 'mesh_axes' has the wrong type");
  // bad values
  expect_error(
      [] {
        collective_attrs(node_of("ar", "AllReduce", {{"mesh_axes", kAxes01}, {"reduction", std::string("mean")}}));
      },
      "ar", "unknown reduction 'mean'");
  expect_error(
      [] {
        mesh_axes_attr(node_of("ar", "AllReduce", {{"mesh_axes", std::vector<int64_t>{0, -1}}}));
      },
      "ar", "invalid mesh axis -1");
  // the wrong op for the reader
  expect_error([] { shard_slice_attrs(node_of("m", "MaskPad", {})); }, "m", "expected a gspmd.ShardSlice node");
  expect_error([] { mask_pad_attrs(node_of("s", "ShardSlice", {}, "")); }, "s", "expected a gspmd.MaskPad node");
  expect_error(
      [] {
        partition_offset_attrs(node_of("ar", "AllReduce", {{"mesh_axes", kAxes01}}));
      },
      "ar", "expected a gspmd.PartitionOffset node");
  expect_error([] { collective_attrs(node_of("s", "ShardSlice", {})); }, "s", "expected a gspmd collective");
  expect_error([] { collective_attrs(node_of("mm", "MatMul", {}, "")); }, "mm", "expected a gspmd collective");
}

}  // namespace
}  // namespace gspmd
