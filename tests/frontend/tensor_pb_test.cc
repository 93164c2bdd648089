// read_tensor_pb / write_tensor_pb.
#include <cstring>

#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using test::frontend_data;
using test::TempDir;

template <class T>
Tensor make(DType dt, Shape s, std::vector<T> v) {
  Tensor t(dt, std::move(s));
  std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(T));
  return t;
}

TEST(TensorPb, RoundTrip) {
  TempDir d;
  std::vector<Tensor> ts = {
      Tensor::from_floats({2, 2}, {1.f, -2.f, 3.5f, 0.f}),
      Tensor::from_int64s({5, -7, int64_t{1} << 50}),
      Tensor::from_int64s({42}, /*scalar=*/true),
      make<int32_t>(DType::kInt32, {3}, {1, -1, 2147483647}),
      make<uint8_t>(DType::kBool, {2, 1}, {1, 0}),
      make<double>(DType::kFloat64, {2}, {0.125, -3e200}),
      Tensor(DType::kFloat32, {0, 3}),
  };
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string p = d.file("t" + std::to_string(i) + ".pb");
    write_tensor_pb(p, ts[i], "name");
    Tensor back = read_tensor_pb(p);
    EXPECT_EQ(back.dtype, ts[i].dtype) << i;
    EXPECT_EQ(back.shape, ts[i].shape) << i;
    EXPECT_EQ(back.bytes, ts[i].bytes) << i;
  }
}

TEST(TensorPb, TypedFields) {
  Tensor f = read_tensor_pb(frontend_data("typed_float.pb"));
  EXPECT_EQ(f.dtype, DType::kFloat32);
  EXPECT_EQ(f.shape, (Shape{2, 3}));
  EXPECT_EQ(f.data<float>()[5], -5.f);
  Tensor i = read_tensor_pb(frontend_data("typed_int64.pb"));
  EXPECT_EQ(i.as_int64s(), (std::vector<int64_t>{1, -2, int64_t{1} << 40}));
  Tensor i32 = read_tensor_pb(frontend_data("typed_int32.pb"));
  EXPECT_EQ(i32.dtype, DType::kInt32);
  EXPECT_EQ(i32.as_int64s(), (std::vector<int64_t>{7, -8}));
  Tensor b = read_tensor_pb(frontend_data("typed_bool.pb"));
  EXPECT_EQ(b.dtype, DType::kBool);
  EXPECT_EQ(b.as_int64s(), (std::vector<int64_t>{1, 0, 0, 1}));
  Tensor dd = read_tensor_pb(frontend_data("typed_double.pb"));
  EXPECT_EQ(dd.data<double>()[1], -1e300);
  Tensor r = read_tensor_pb(frontend_data("raw_float.pb"));
  EXPECT_EQ(r.shape, (Shape{1, 2}));
  EXPECT_EQ(r.data<float>()[1], 2.5f);
}

TEST(TensorPb, Errors) {
  TempDir d;
  const std::string missing = d.file("missing.pb");
  test::expect_input_error([&] { read_tensor_pb(missing); }, missing + ": cannot open file");
  const std::string bad = d.write("bad.pb", std::string("\xff\xff\xff\xff\x0f", 5));
  test::expect_input_error([&] { read_tensor_pb(bad); }, bad + ": not a valid serialized onnx.TensorProto");
}

}  // namespace
}  // namespace gspmd
