// Attribute equality, bytes and text (core/ir/attrs.h): the one definition the rule cache, the program fingerprint,
// the measured-op signatures and the layer blocks' match share.
#include "core/ir/attrs.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace gspmd {
namespace {

std::string bytes_of(const std::map<std::string, AttrValue>& attrs, int* bodies = nullptr) {
  std::string out;
  attr_bytes(
      attrs, [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); },
      [&](const Graph&) {
        if (bodies) ++*bodies;
      });
  return out;
}

std::string i64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }

// The layout program_fingerprint hashes (every device file carries the hash): count, then per attribute its name,
// kind and value.
TEST(Attrs, BytesFollowTheDocumentedLayout) {
  const float f = 0.5f;
  const std::string expected = i64(2) +                              // two attributes
                               i64(4) + "axis" + i64(0) + i64(-1) +  // int64 (kind 0)
                               i64(5) + "scale" + i64(1) + std::string(reinterpret_cast<const char*>(&f), 4);
  EXPECT_EQ(bytes_of({{"axis", int64_t{-1}}, {"scale", 0.5f}}), expected);
  EXPECT_EQ(bytes_of({{"perm", std::vector<int64_t>{1, 0}}}),
            i64(1) + i64(4) + "perm" + i64(3) + i64(2) + i64(1) + i64(0));
  EXPECT_EQ(bytes_of({{"s", std::vector<std::string>{"ab", ""}}}),
            i64(1) + i64(1) + "s" + i64(5) + i64(2) + i64(2) + "ab" + i64(0));
  Tensor t = Tensor::from_int64s({7});
  EXPECT_EQ(bytes_of({{"value", t}}),
            i64(1) + i64(5) + "value" + i64(6) + i64(static_cast<int64_t>(DType::kInt64)) + i64(1) + i64(1) + i64(7));
  // A body goes to the body sink, not the bytes.
  int bodies = 0;
  EXPECT_EQ(bytes_of({{"body", std::make_shared<const Graph>()}}, &bodies), i64(1) + i64(4) + "body" + i64(7));
  EXPECT_EQ(bodies, 1);
}

TEST(Attrs, EqualityIsOfKindAndBytes) {
  EXPECT_TRUE(attr_equal(int64_t{3}, int64_t{3}));
  EXPECT_FALSE(attr_equal(int64_t{3}, int64_t{4}));
  EXPECT_FALSE(attr_equal(int64_t{1}, 1.f));                               // another kind
  EXPECT_FALSE(attr_equal(std::vector<int64_t>{}, std::vector<float>{}));  // empty lists of two kinds
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(attr_equal(nan, nan));    // bit for bit, as the fingerprint sees it
  EXPECT_FALSE(attr_equal(0.f, -0.f));  // two bit patterns
  EXPECT_TRUE(attr_equal(Tensor::from_int64s({1, 2}), Tensor::from_int64s({1, 2})));
  EXPECT_FALSE(attr_equal(Tensor::from_int64s({1, 2}), Tensor::from_int64s({2, 1})));
  auto g = std::make_shared<const Graph>();
  EXPECT_TRUE(attr_equal(g, g));
  EXPECT_FALSE(attr_equal(g, std::make_shared<const Graph>()));  // a body: the same object only
  EXPECT_TRUE(attrs_equal({{"a", int64_t{1}}, {"b", std::string("x")}}, {{"a", int64_t{1}}, {"b", std::string("x")}}));
  EXPECT_FALSE(attrs_equal({{"a", int64_t{1}}}, {{"b", int64_t{1}}}));
  EXPECT_FALSE(attrs_equal({{"a", int64_t{1}}}, {{"a", int64_t{1}}, {"b", int64_t{1}}}));
}

// The text measured-op signatures are keyed by (host target files store them).
TEST(Attrs, TextAsSignaturesWriteIt) {
  EXPECT_EQ(attr_text(int64_t{-2}), "-2");
  EXPECT_EQ(attr_text(0.25f), "0.25");
  EXPECT_EQ(attr_text(std::string("NOTSET")), "NOTSET");
  EXPECT_EQ(attr_text(std::vector<int64_t>{0, 2, 1}), "[0,2,1]");
  EXPECT_EQ(attr_text(std::vector<float>{1.5f}), "[1.5]");
  EXPECT_EQ(attr_text(std::vector<std::string>{"a", "b"}), "[a,b]");
  EXPECT_EQ(attr_text(Tensor::from_int64s({1, 2, 3})), "int64[3]");
  EXPECT_EQ(attr_text(std::make_shared<const Graph>()), "graph(0 nodes)");
}

}  // namespace
}  // namespace gspmd
