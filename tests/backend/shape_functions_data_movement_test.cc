// Shape functions of the data-movement, indexing, einsum and misc kernels (core/shapes/shape_ops.cc, gather.cc,
// index.cc, einsum.cc, misc.cc; DepthToSpace / SpaceToDepth of conv_pool.cc, CastLike and Dropout of
// elementwise.cc): exact types for the tricky ops, the kernels' own results agreeing with them, and
// DataDependentError when an output size depends on an input that is not constant.
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "tests/test_util/graph_builder.h"
#include "tests/test_util/shape_infer.h"

namespace gspmd {
namespace {

using Types = std::vector<TensorType>;
using Ints = std::vector<int64_t>;
using testing::agree;
using testing::B;
using testing::data_dependent;
using testing::error_of;
using testing::F;
using testing::I;
using testing::infer;
using testing::make_node;
using testing::rand_f;

const DType f32 = DType::kFloat32, i64 = DType::kInt64;

TEST(ShapeFunctionsDataMovement, ReshapeAndFriends) {
  const Tensor x = rand_f({2, 3, 4}, 1);
  const Tensor spec = I({3}, {0, -1, 2});
  EXPECT_EQ(agree(make_node("Reshape"), {&x, &spec}), (Types{{f32, {2, 6, 2}}}));
  EXPECT_EQ(data_dependent(make_node("Reshape"), {&x, &spec}, {}),
            "node 'n1' (Reshape): output shape depends on the values of input 1 (the target shape)");
  const Tensor bad = I({2}, {5, -1});
  EXPECT_EQ(error_of(make_node("Reshape"), {&x, &bad}), "node 'n1' (Reshape): cannot reshape [2,3,4] to [5,-1]");
  EXPECT_EQ(agree(make_node("Flatten", {{"axis", int64_t{-1}}}), {&x}), (Types{{f32, {6, 4}}}));
  const Tensor y = rand_f({1, 3, 1}, 2), axes = I({1}, {-1});
  EXPECT_EQ(agree(make_node("Squeeze"), {&y}), (Types{{f32, {3}}}));
  EXPECT_EQ(agree(make_node("Squeeze"), {&y, &axes}), (Types{{f32, {1, 3}}}));
  EXPECT_EQ(agree(make_node("Squeeze", {{"axes", Ints{0}}}), {&y}, 11), (Types{{f32, {3, 1}}}));
  EXPECT_EQ(agree(make_node("Unsqueeze"), {&y, &axes}), (Types{{f32, {1, 3, 1, 1}}}));
  EXPECT_EQ(data_dependent(make_node("Unsqueeze"), {&y, &axes}, {}),
            "node 'n1' (Unsqueeze): output shape depends on the values of input 1 (the axes)");
  EXPECT_EQ(agree(make_node("Transpose", {{"perm", Ints{2, 0, 1}}}), {&x}), (Types{{f32, {4, 2, 3}}}));
  EXPECT_EQ(error_of(make_node("Transpose", {{"perm", Ints{0, 0, 1}}}), {&x}),
            "node 'n1' (Transpose): perm [0,0,1] is not a permutation");
}

TEST(ShapeFunctionsDataMovement, SliceSplitConcatPad) {
  const Tensor x = rand_f({5, 6}, 3);
  const Tensor starts = I({2}, {-1, 1}), ends = I({2}, {-100, 100}), axes = I({2}, {0, 1}), steps = I({2}, {-2, 2});
  EXPECT_EQ(agree(make_node("Slice"), {&x, &starts, &ends, &axes, &steps}), (Types{{f32, {3, 3}}}));
  EXPECT_EQ(agree(make_node("Slice", {{"starts", Ints{1}}, {"ends", Ints{3}}, {"axes", Ints{1}}}), {&x}, 9),
            (Types{{f32, {5, 2}}}));
  EXPECT_EQ(data_dependent(make_node("Slice"), {&x, &starts, &ends, &axes, &steps}, {1, 2, 3}),
            "node 'n1' (Slice): output shape depends on the values of input 4 (the steps)");
  // Split: the split input, num_outputs (opset 18: last part smaller), equal parts per declared output.
  const Tensor split = I({2}, {2, 4});
  EXPECT_EQ(agree(make_node("Split", {{"axis", int64_t{1}}}, 2), {&x, &split}), (Types{{f32, {5, 2}}, {f32, {5, 4}}}));
  EXPECT_EQ(agree(make_node("Split", {{"num_outputs", int64_t{2}}}, 2), {&x}, 18),
            (Types{{f32, {3, 6}}, {f32, {2, 6}}}));
  EXPECT_EQ(agree(make_node("Split", {{"axis", int64_t{1}}}, 3), {&x}),
            (Types{{f32, {5, 2}}, {f32, {5, 2}}, {f32, {5, 2}}}));
  EXPECT_EQ(error_of(make_node("Split", {}, 2), {&x}),
            "node 'n1' (Split): axis of size 5 does not split evenly into 2 outputs");
  const Tensor a = rand_f({5, 2}, 4);
  EXPECT_EQ(agree(make_node("Concat", {{"axis", int64_t{-1}}}), {&x, &a}), (Types{{f32, {5, 8}}}));
  EXPECT_EQ(error_of(make_node("Concat", {{"axis", int64_t{0}}}), {&x, &a}),
            "node 'n1' (Concat): input 1 has shape [5,2], incompatible with [5,6] on axis 0");
  // Pad: pads attribute before opset 11, input after, axes input at 18; negative pads crop.
  EXPECT_EQ(agree(make_node("Pad", {{"pads", Ints{1, 0, 2, -1}}}), {&x}, 2), (Types{{f32, {8, 5}}}));
  const Tensor pads = I({2}, {1, 3}), pad_axes = I({1}, {-1});
  EXPECT_EQ(agree(make_node("Pad"), {&x, &pads, nullptr, &pad_axes}, 18), (Types{{f32, {5, 10}}}));
  EXPECT_EQ(error_of(make_node("Pad"), {&x, &pads}), "node 'n1' (Pad): pads has 2 entries for 2 axes");
}

TEST(ShapeFunctionsDataMovement, GeneratorsAndShapeOps) {
  const Tensor shape = I({2}, {3, 0});
  Node cos = make_node("ConstantOfShape", {{"value", I({1}, {7})}});
  EXPECT_EQ(agree(cos, {&shape}), (Types{{i64, {3, 0}}}));
  EXPECT_EQ(agree(make_node("ConstantOfShape"), {&shape}), (Types{{f32, {3, 0}}}));
  const Tensor s = F({}, {1.f}), l = F({}, {2.f}), d = F({}, {0.3f});
  EXPECT_EQ(agree(make_node("Range"), {&s, &l, &d}), (Types{{f32, {4}}}));
  const Tensor si = I({}, {10}), li = I({}, {4}), di = I({}, {-3});
  EXPECT_EQ(agree(make_node("Range"), {&si, &li, &di}), (Types{{i64, {2}}}));
  EXPECT_EQ(data_dependent(make_node("Range"), {&si, &li, &di}, {0, 2}),
            "node 'n1' (Range): output shape depends on the values of input 1 (the limit)");
  EXPECT_EQ(error_of(make_node("Range"), {&s, &li, &d}), "node 'n1' (Range): start, limit and delta differ in dtype");
  const Tensor x = rand_f({2, 3, 4}, 5);
  EXPECT_EQ(agree(make_node("Shape", {{"start", int64_t{-2}}}), {&x}, 15), (Types{{i64, {2}}}));
  EXPECT_EQ(agree(make_node("Shape", {{"start", int64_t{2}}, {"end", int64_t{1}}}), {&x}, 15), (Types{{i64, {0}}}));
  EXPECT_EQ(agree(make_node("Size"), {&x}), (Types{{i64, {}}}));
  EXPECT_EQ(agree(make_node("Constant", {{"value_ints", Ints{1, 2, 3}}}), {}), (Types{{i64, {3}}}));
  EXPECT_EQ(agree(make_node("Constant", {{"value_float", 1.5f}}), {}), (Types{{f32, {}}}));
  EXPECT_EQ(agree(make_node("Constant", {{"value", rand_f({2, 2}, 6)}}), {}), (Types{{f32, {2, 2}}}));
  EXPECT_THROW(infer(make_node("Constant", {{"value_string", std::string("a")}}), {}), UnsupportedError);
  const Tensor reps = I({3}, {1, 2, 0});
  EXPECT_EQ(agree(make_node("Tile"), {&x, &reps}), (Types{{f32, {2, 6, 0}}}));
  const Tensor to = I({4}, {5, 1, 3, 1});
  EXPECT_EQ(agree(make_node("Expand"), {&x, &to}), (Types{{f32, {5, 2, 3, 4}}}));
  // Dropout's mask is bool (as the kernel makes it, also before opset 10).
  EXPECT_EQ(agree(make_node("Dropout", {}, 2), {&x}), (Types{{f32, {2, 3, 4}}, {DType::kBool, {2, 3, 4}}}));
  const Tensor idx = I({2, 1}, {0, -1});
  EXPECT_EQ(agree(make_node("Gather", {{"axis", int64_t{1}}}), {&x, &idx}), (Types{{f32, {2, 2, 1, 4}}}));
}

TEST(ShapeFunctionsDataMovement, IndexingOps) {
  const Tensor x = rand_f({2, 3, 4}, 7);
  // OneHot: depth inserted at axis, values' dtype.
  const Tensor ids = I({2, 3}, {0, 1, 2, 3, 4, 5}), depth = F({}, {6.9f}), values = I({2}, {0, 1});
  EXPECT_EQ(agree(make_node("OneHot", {{"axis", int64_t{1}}}), {&ids, &depth, &values}), (Types{{i64, {2, 6, 3}}}));
  EXPECT_EQ(agree(make_node("OneHot"), {&ids, &depth, &values}), (Types{{i64, {2, 3, 6}}}));
  EXPECT_EQ(data_dependent(make_node("OneHot"), {&ids, &depth, &values}, {0, 2}),
            "node 'n1' (OneHot): output shape depends on the values of input 1 (the depth)");
  // TopK: K as an attribute before opset 10, as an input after; indices int64.
  const Tensor k = I({1}, {2});
  EXPECT_EQ(agree(make_node("TopK", {{"axis", int64_t{1}}}, 2), {&x, &k}), (Types{{f32, {2, 2, 4}}, {i64, {2, 2, 4}}}));
  EXPECT_EQ(agree(make_node("TopK", {{"k", int64_t{3}}}, 2), {&x}, 1), (Types{{f32, {2, 3, 3}}, {i64, {2, 3, 3}}}));
  EXPECT_EQ(data_dependent(make_node("TopK", {}, 2), {&x, &k}, {}),
            "node 'n1' (TopK): output shape depends on the values of input 1 (K)");
  const Tensor big_k = I({1}, {5});
  EXPECT_EQ(error_of(make_node("TopK", {}, 2), {&x, &big_k}),
            "node 'n1' (TopK): K=5 out of range for an axis of size 4");
  const Tensor gi = I({1, 2}, {0, 0});
  EXPECT_EQ(agree(make_node("GatherND", {{"batch_dims", int64_t{0}}}), {&x, &gi}), (Types{{f32, {1, 4}}}));
  const Tensor ei = I({2, 3, 1}, {0, 1, 2, 3, 0, 1});
  EXPECT_EQ(agree(make_node("GatherElements", {{"axis", int64_t{2}}}), {&x, &ei}), (Types{{f32, {2, 3, 1}}}));
  const Tensor upd = rand_f({1, 4}, 8);
  EXPECT_EQ(agree(make_node("ScatterND"), {&x, &gi, &upd}), (Types{{f32, {2, 3, 4}}}));
  EXPECT_EQ(error_of(make_node("ScatterND"), {&x, &gi, &x}),
            "node 'n1' (ScatterND): updates of shape [2,3,4] do not match expected [1,4]");
  const Tensor img = rand_f({1, 8, 2, 3}, 9);
  EXPECT_EQ(agree(make_node("DepthToSpace", {{"blocksize", int64_t{2}}}), {&img}), (Types{{f32, {1, 2, 4, 6}}}));
  const Tensor img2 = rand_f({1, 2, 4, 6}, 10);
  EXPECT_EQ(agree(make_node("SpaceToDepth", {{"blocksize", int64_t{2}}}), {&img2}), (Types{{f32, {1, 8, 2, 3}}}));
  const Tensor m = rand_f({3, 2}, 11);
  EXPECT_EQ(agree(make_node("EyeLike", {{"dtype", int64_t{7}}}), {&m}), (Types{{i64, {3, 2}}}));
  EXPECT_EQ(agree(make_node("CastLike"), {&m, &k}), (Types{{i64, {3, 2}}}));
}

TEST(ShapeFunctionsDataMovement, DataDependentOps) {
  // NonZero, Unique, Compress and NonMaxSuppression: exact when the deciding values are constant.
  const Tensor x = I({2, 3}, {0, 1, 0, 2, 2, 0});
  EXPECT_EQ(agree(make_node("NonZero"), {&x}), (Types{{i64, {2, 3}}}));
  EXPECT_EQ(data_dependent(make_node("NonZero"), {&x}, {}),
            "node 'n1' (NonZero): output shape depends on the values of input 0 (the non-zero count)");
  EXPECT_EQ(agree(make_node("Unique", {}, 4), {&x}), (Types{{i64, {3}}, {i64, {3}}, {i64, {6}}, {i64, {3}}}));
  EXPECT_EQ(agree(make_node("Unique", {{"axis", int64_t{1}}}, 2), {&x}), (Types{{i64, {2, 3}}, {i64, {3}}}));
  EXPECT_EQ(data_dependent(make_node("Unique"), {&x}, {}),
            "node 'n1' (Unique): output shape depends on the values of input 0 (the unique elements)");
  const Tensor cond = B({2}, {0, 1});
  EXPECT_EQ(agree(make_node("Compress", {{"axis", int64_t{1}}}), {&x, &cond}), (Types{{i64, {2, 1}}}));
  EXPECT_EQ(agree(make_node("Compress"), {&x, &cond}), (Types{{i64, {1}}}));
  EXPECT_EQ(data_dependent(make_node("Compress"), {&x, &cond}, {1}), "no DataDependentError");
  EXPECT_EQ(data_dependent(make_node("Compress"), {&x, &cond}, {0}),
            "node 'n1' (Compress): output shape depends on the values of input 1 (the condition)");
  const Tensor boxes = F({1, 2, 4}, {0, 0, 1, 1, 0, 0, 1, 1}), scores = F({1, 1, 2}, {0.9f, 0.8f});
  const Tensor max_out = I({1}, {5});
  EXPECT_EQ(agree(make_node("NonMaxSuppression"), {&boxes, &scores, &max_out}), (Types{{i64, {1, 3}}}));
  EXPECT_EQ(data_dependent(make_node("NonMaxSuppression"), {&boxes, &scores, &max_out}, {0, 1}),
            "node 'n1' (NonMaxSuppression): output shape depends on the values of input 2 "
            "(max_output_boxes_per_class)");
}

TEST(ShapeFunctionsDataMovement, ResizeUpsampleEinsum) {
  const Tensor x = rand_f({1, 1, 3, 5}, 12);
  const Tensor scales = F({4}, {1, 1, 2.5f, 0.5f}), sizes = I({4}, {1, 1, 7, 1});
  EXPECT_EQ(agree(make_node("Resize"), {&x, nullptr, &scales}, 13), (Types{{f32, {1, 1, 7, 2}}}));
  const Tensor empty = F({0}, {});
  EXPECT_EQ(agree(make_node("Resize"), {&x, &empty, &empty, &sizes}, 11), (Types{{f32, {1, 1, 7, 1}}}));
  EXPECT_EQ(agree(make_node("Resize"), {&x, &scales}, 10), (Types{{f32, {1, 1, 7, 2}}}));
  EXPECT_EQ(agree(make_node("Upsample", {{"scales", std::vector<float>{1, 1, 2, 2}}}), {&x}, 7),
            (Types{{f32, {1, 1, 6, 10}}}));
  EXPECT_EQ(data_dependent(make_node("Resize"), {&x, &empty, &empty, &sizes}, {1, 2}, 13),
            "node 'n1' (Resize): output shape depends on the values of input 3 (the sizes)");
  EXPECT_EQ(error_of(make_node("Resize"), {&x, nullptr, &scales, &sizes}, true, 13),
            "node 'n1' (Resize): exactly one of scales and sizes must be given");
  EXPECT_THROW(infer(make_node("Resize", {{"antialias", int64_t{1}}}), {&x, nullptr, &scales}, true, 18),
               UnsupportedError);
  // Einsum: explicit and implicit outputs, ellipsis broadcast, diagonals.
  const Tensor a = rand_f({2, 3, 4}, 13), b = rand_f({4, 5}, 14), c = rand_f({1, 4, 5}, 15), sq = rand_f({3, 3}, 16);
  EXPECT_EQ(agree(make_node("Einsum", {{"equation", std::string("bij,jk->bik")}}), {&a, &b}),
            (Types{{f32, {2, 3, 5}}}));
  EXPECT_EQ(agree(make_node("Einsum", {{"equation", std::string("...ij,...jk")}}), {&a, &c}),
            (Types{{f32, {2, 3, 5}}}));
  EXPECT_EQ(agree(make_node("Einsum", {{"equation", std::string("ii->i")}}), {&sq}), (Types{{f32, {3}}}));
  EXPECT_EQ(agree(make_node("Einsum", {{"equation", std::string("ij")}}), {&b}), (Types{{f32, {4, 5}}}));
  EXPECT_EQ(agree(make_node("Einsum", {{"equation", std::string("ji")}}), {&b}), (Types{{f32, {5, 4}}}));
  EXPECT_EQ(error_of(make_node("Einsum", {{"equation", std::string("ij,ij->i")}}), {&b, &sq}),
            "node 'n1' (Einsum): label 'i' has sizes 4 and 3");
}

}  // namespace
}  // namespace gspmd
