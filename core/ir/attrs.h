// core/ir: what a node attribute's value is equal to, its bytes and its text, defined once for every place that
// compares, hashes or prints attributes: the rule cache's key (core/rules), the program fingerprint (core/program),
// the measured ops' signatures (core/cost) and the layer blocks' match (core/pipeline).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>

#include "core/ir/ir.h"

namespace gspmd {

/// Receives the canonical bytes of attributes (attr_bytes): `put(data, size)`.
using BytesSink = std::function<void(const void*, size_t)>;
/// Receives a graph attribute (a control-flow body) in place of its bytes.
using BodySink = std::function<void(const Graph&)>;

/// The canonical bytes of attributes `attrs` (std::map: in name order): their count as an int64, then per attribute
/// its name (an int64 length, then its characters), its kind (the AttrValue variant index, an int64) and its value:
/// an int64's 8 bytes; a float's 4 (its bit pattern); a string as a name; a list as an int64 count, then each element
/// as above; a Tensor as its dtype (an int64), its shape (an int64 list) and its raw data. A graph body goes to
/// `body` instead. Integers are written in host byte order (little-endian here). This is the byte layout of
/// program_fingerprint (core/program/program.h), whose hash every device file carries: it must not change.
void attr_bytes(const std::map<std::string, AttrValue>& attrs, const BytesSink& put, const BodySink& body);

/// True when `a` and `b` are the same attribute value: the same kind and the same canonical bytes (a float or a
/// float list bit for bit), a graph body the same Graph object.
bool attr_equal(const AttrValue& a, const AttrValue& b);

/// True when `a` and `b` have the same names with equal values (attr_equal).
bool attrs_equal(const std::map<std::string, AttrValue>& a, const std::map<std::string, AttrValue>& b);

/// An attribute value as text, as measured-op signatures write it (core/cost/cost.h, op_signature): an int or float
/// by fmt's "{}", a string as itself, a list "[a,b]", a Tensor "float32[2,3]" (its type, not its data), a graph body
/// "graph(N nodes)".
std::string attr_text(const AttrValue& a);

}  // namespace gspmd
