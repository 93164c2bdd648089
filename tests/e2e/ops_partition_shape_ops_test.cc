// Partitioning data movement and shape operands (the generic driver and the local rewrites of Reshape and Squeeze):
// Transpose, Reshape, Squeeze, Concat, Slice, Split, Resize, Expand, Tile...; Shape and Size.
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Data movement

TEST(OpsPartition, TransposeReshapeSqueeze) {
  std::vector<Case> cs;
  {
    Builder B("Transpose perm [2,0,1]");
    int X = B.fin("X", {3, 5, 7});
    B.out(B.opf("Transpose", {X}, "Y", {7, 3, 5}, {{"perm", std::vector<int64_t>{2, 0, 1}}}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Transpose default perm");
    int X = B.fin("X", {5, 9});
    B.out(B.opf("Transpose", {X}, "Y", {9, 5}), true);
    cs.push_back(B.done());
  }
  auto reshape = [&](Shape in, std::vector<int64_t> target, Shape out) {
    Builder B("Reshape " + shape_str(in) + " -> " + shape_str(target));
    int X = B.fin("X", in);
    B.out(B.opf("Reshape", {X, B.ints("shape", target)}, "Y", out), true);
    cs.push_back(B.done());
  };
  reshape({6, 4}, {2, 3, 4}, {2, 3, 4});
  reshape({2, 3, 4}, {6, 4}, {6, 4});
  reshape({2, 3, 4}, {-1, 4}, {6, 4});
  reshape({2, 5, 12}, {2, 5, 3, 4}, {2, 5, 3, 4});
  reshape({2, 5, 12}, {0, 0, 3, -1}, {2, 5, 3, 4});
  reshape({2, 5, 12}, {2, 5, 4, 3}, {2, 5, 4, 3});
  reshape({3, 5, 9}, {3, 5, 3, 3}, {3, 5, 3, 3});
  reshape({2, 5, 3, 4}, {2, 5, 12}, {2, 5, 12});
  reshape({5, 7}, {35}, {35});
  reshape({35}, {5, 7}, {5, 7});
  {
    Builder B("Unsqueeze [5,7] axes [0,2]");
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Unsqueeze", {X, B.ints("axes", {0, 2})}, "Y", {1, 5, 1, 7}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Unsqueeze [5,7] axes [-1]");
    int X = B.fin("X", {5, 7});
    B.out(B.opf("Unsqueeze", {X, B.ints("axes", {-1})}, "Y", {5, 7, 1}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [5,1,7] axes [1]");
    int X = B.fin("X", {5, 1, 7});
    B.out(B.opf("Squeeze", {X, B.ints("axes", {1})}, "Y", {5, 7}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [1,9,1] axes [0,-1]");
    int X = B.fin("X", {1, 9, 1});
    B.out(B.opf("Squeeze", {X, B.ints("axes", {0, -1})}, "Y", {9}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Squeeze [3,1,5] no axes");
    int X = B.fin("X", {3, 1, 5});
    B.out(B.opf("Squeeze", {X}, "Y", {3, 5}), true);
    cs.push_back(B.done());
  }
  run_all("Transpose/Reshape/Unsqueeze/Squeeze", cs);
}

TEST(OpsPartition, ConcatSliceSplit) {
  std::vector<Case> cs;
  {
    Builder B("Concat axis 0 [3,5]+[4,5]");
    int A = B.fin("A", {3, 5});
    int C = B.fin("C", {4, 5});
    B.out(B.opf("Concat", {A, C}, "Y", {7, 5}, {{"axis", int64_t{0}}}), true);
    cs.push_back(B.done(70));
  }
  {
    Builder B("Concat axis 1 [5,3]+[5,4]+[5,2]");
    int A = B.fin("A", {5, 3});
    int C = B.fin("C", {5, 4});
    int D = B.fin("D", {5, 2});
    B.out(B.opf("Concat", {A, C, D}, "Y", {5, 9}, {{"axis", int64_t{1}}}), true);
    cs.push_back(B.done(70));
  }
  {
    Builder B("Concat axis -1 [2,3,4]+[2,3,5]");
    int A = B.fin("A", {2, 3, 4});
    int C = B.fin("C", {2, 3, 5});
    B.out(B.opf("Concat", {A, C}, "Y", {2, 3, 9}, {{"axis", int64_t{-1}}}), true);
    cs.push_back(B.done(70));
  }
  auto slice = [&](const std::string& nm, Shape in, std::vector<int64_t> st, std::vector<int64_t> en,
                   std::vector<int64_t> ax, std::vector<int64_t> sp, Shape out) {
    Builder B("Slice " + nm + " " + shape_str(in) + " starts=" + shape_str(st) + " ends=" + shape_str(en) +
              " axes=" + shape_str(ax) + " steps=" + shape_str(sp));
    int X = B.fin("X", in);
    std::vector<int> ins = {X, B.ints("starts", st), B.ints("ends", en)};
    if (!ax.empty()) ins.push_back(B.ints("axes", ax));
    if (!sp.empty()) ins.push_back(B.ints("steps", sp));
    B.out(B.opf("Slice", ins, "Y", out), true);
    cs.push_back(B.done());
  };
  slice("step2+neg", {7, 9}, {1, -7}, {6, 100}, {0, 1}, {2, 1}, {3, 7});
  slice("reverse", {5, 9}, {-1}, {std::numeric_limits<int64_t>::min()}, {1}, {-2}, {5, 5});
  slice("full-reverse", {5, 7}, {-1}, {-100}, {1}, {-1}, {5, 7});
  slice("unsplit-dim-only", {6, 9}, {2}, {-2}, {1}, {}, {6, 5});
  slice("no-op", {5, 7}, {0}, {7}, {1}, {1}, {5, 7});
  slice("default-axes", {7, 5}, {2}, {5}, {}, {}, {3, 5});
  slice("3-D neg axis", {3, 5, 7}, {1, 0}, {5, 7}, {-2, -1}, {1, 3}, {3, 4, 3});
  {
    Builder B("Split axis 0 sizes [3,4] [7,6]");
    int X = B.fin("X", {7, 6});
    auto o =
        B.op("Split", {X, B.ints("split", {3, 4})}, {{"Y0", F32, {3, 6}}, {"Y1", F32, {4, 6}}}, {{"axis", int64_t{0}}});
    B.out(o[0], true);
    B.out(o[1]);
    cs.push_back(B.done());
  }
  {
    Builder B("Split axis 1 equal 3 outputs [5,9]");
    int X = B.fin("X", {5, 9});
    auto o =
        B.op("Split", {X}, {{"Y0", F32, {5, 3}}, {"Y1", F32, {5, 3}}, {"Y2", F32, {5, 3}}}, {{"axis", int64_t{1}}});
    for (int v : o) B.out(v);
    cs.push_back(B.done());
  }
  {
    Builder B("Split axis -1 sizes [2,3,4] [3,5,9]");
    int X = B.fin("X", {3, 5, 9});
    auto o = B.op("Split", {X, B.ints("split", {2, 3, 4})},
                  {{"Y0", F32, {3, 5, 2}}, {"Y1", F32, {3, 5, 3}}, {"Y2", F32, {3, 5, 4}}}, {{"axis", int64_t{-1}}});
    for (int v : o) B.out(v, v == o[2]);
    cs.push_back(B.done());
  }
  {
    Builder B("Split opset 13 axis 0 equal [8,5]", 13);
    int X = B.fin("X", {8, 5});
    auto o = B.op("Split", {X}, {{"Y0", F32, {4, 5}}, {"Y1", F32, {4, 5}}}, {{"axis", int64_t{0}}});
    for (int v : o) B.out(v);
    cs.push_back(B.done());
  }
  run_all("Concat/Slice/Split", cs);
}

// Ops whose operands hold a result shape or sizes (docs/partitioning.md): Resize's `sizes`, Expand's and Reshape's
// `shape`, Tile's `repeats`, ConstantOfShape's and Range's operands, given as constants and computed from the input
// by Shape / Gather / Concat (torchvision's segmentation heads: Resize to Concat(Shape(x)[0:2], [H, W])). Every
// sharding of the input (batch, channel, row, column splits, even and uneven) must give the unpartitioned result.
TEST(OpsPartition, ShapeOperands) {
  std::vector<Case> cs;
  const std::map<std::string, AttrValue> nearest = {{"mode", std::string("nearest")}};
  auto resize = [&](const std::string& nm, Shape in, Shape sizes, bool computed,
                    std::map<std::string, AttrValue> attrs) {
    Builder B("Resize " + nm + " " + shape_str(in) + " sizes=" + shape_str(sizes) +
              (computed ? " (computed from Shape)" : ""));
    int X = B.fin("X", in);
    int S = -1;
    if (computed) {  // Concat(Shape(X)[0:2], sizes[2:]): the batch and channel from the input
      int shp = B.op1("Shape", {X}, "shape", I64, {static_cast<int64_t>(in.size())});
      int nc = B.op1("Slice", {shp, B.ints("s0", {0}), B.ints("s1", {2})}, "nc", I64, {2});
      int hw = B.ints("hw", {sizes.begin() + 2, sizes.end()});
      S = B.op1("Concat", {nc, hw}, "sizes", I64, {static_cast<int64_t>(sizes.size())}, {{"axis", int64_t{0}}});
    } else {
      S = B.ints("sizes", sizes);
    }
    int roi = B.init("roi", Tensor(F32, {0})), scales = B.init("scales", Tensor(F32, {0}));
    B.out(B.opf("Resize", {X, roi, scales, S}, "Y", sizes, attrs), true);
    cs.push_back(B.done(40));
  };
  resize("nearest 2x", {4, 3, 6, 5}, {4, 3, 12, 10}, false, nearest);
  resize("nearest 2x", {4, 3, 6, 5}, {4, 3, 12, 10}, true, nearest);
  resize("linear rows kept", {5, 2, 6, 4}, {5, 2, 6, 7}, false, {{"mode", std::string("linear")}});
  resize("linear rows kept", {5, 2, 6, 4}, {5, 2, 6, 7}, true, {{"mode", std::string("linear")}});
  resize("same size", {3, 2, 5, 4}, {3, 2, 5, 4}, false, {{"mode", std::string("linear")}});
  {
    Builder B("Expand [5,1,4] to Concat(Shape(X)[0:1], [3], Shape(X)[2:3])");
    int X = B.fin("X", {5, 1, 4});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int a = B.op1("Gather", {shp, B.ints("i0", {0})}, "a", I64, {1}, {{"axis", int64_t{0}}});
    int c = B.op1("Gather", {shp, B.ints("i2", {2})}, "c", I64, {1}, {{"axis", int64_t{0}}});
    int S = B.op1("Concat", {a, B.ints("three", {3}), c}, "target", I64, {3}, {{"axis", int64_t{0}}});
    B.out(B.opf("Expand", {X, S}, "Y", {5, 3, 4}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Expand [6,1] constant shape [2,6,5]");
    int X = B.fin("X", {6, 1});
    B.out(B.opf("Expand", {X, B.ints("shape", {2, 6, 5})}, "Y", {2, 6, 5}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Reshape [5,6,4] to Concat(Shape(X)[0:1], [-1])");
    int X = B.fin("X", {5, 6, 4});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int n = B.op1("Slice", {shp, B.ints("s0", {0}), B.ints("s1", {1})}, "n", I64, {1});
    int S = B.op1("Concat", {n, B.ints("rest", {-1})}, "target", I64, {2}, {{"axis", int64_t{0}}});
    B.out(B.opf("Reshape", {X, S}, "Y", {5, 24}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Tile [5,3,4] repeats [1,2,1]");
    int X = B.fin("X", {5, 3, 4});
    B.out(B.opf("Tile", {X, B.ints("repeats", {1, 2, 1})}, "Y", {5, 6, 4}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("ConstantOfShape(Shape(X)) + X [5,4,3]");
    int X = B.fin("X", {5, 4, 3});
    int shp = B.op1("Shape", {X}, "shape", I64, {3});
    int Z = B.opf("ConstantOfShape", {shp}, "Z", {5, 4, 3}, {{"value", Tensor::from_floats({1}, {0.5f})}});
    B.out(B.opf("Add", {X, Z}, "Y", {5, 4, 3}), true);
    cs.push_back(B.done());
  }
  {
    Builder B("Range(0, Shape(X)[1]) + X [5,7]");
    int X = B.fin("X", {5, 7});
    int shp = B.op1("Shape", {X}, "shape", I64, {2});
    int lim =
        B.op1("Gather", {shp, B.init("one", Tensor::from_int64s({1}, true))}, "limit", I64, {}, {{"axis", int64_t{0}}});
    int R = B.op1("Range",
                  {B.init("zero", Tensor::from_int64s({0}, true)), lim, B.init("step", Tensor::from_int64s({1}, true))},
                  "r", I64, {7});
    int Rf = B.opf("Cast", {R}, "rf", {7}, {{"to", int64_t{1}}});
    B.out(B.opf("Add", {X, Rf}, "Y", {5, 7}), true);
    cs.push_back(B.done());
  }
  run_all("Shape operands (Resize/Expand/Reshape/Tile/ConstantOfShape/Range)", cs);
}

// Shape and Size read only their operand's static global shape: a constant on every device, whatever the split, and
// never a collective (before, the operand was gathered).
TEST(OpsPartition, ShapeAndSizeMoveNothing) {
  for (const char* op : {"Shape", "Size"}) {
    Builder B(std::string(op) + " of a split value");
    int X = B.fin("X", {5, 6, 7});
    const bool size = std::string(op) == "Size";
    int Y = B.op1(op, {X}, "Y", I64, size ? Shape{} : Shape{2},
                  size ? std::map<std::string, AttrValue>{} : std::map<std::string, AttrValue>{{"start", int64_t{-2}}});
    B.out(Y);
    B.out(B.opf("Relu", {X}, "Z", {5, 6, 7}));
    Case c = B.done();
    for (const DeviceMesh& mesh : all_meshes())
      for (const TensorSharding& s : all_shardings(3, mesh)) {
        const SpmdProgram p = expect_exact(c, mesh, {{"X", s}});
        EXPECT_EQ(p.collectives.size(), 0u) << op << " " << s.to_partition_spec(mesh) << collectives_str(p);
      }
  }
}

}  // namespace
}  // namespace gspmd::ops_partition
