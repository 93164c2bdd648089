// onnx_frontend internal: conversions between onnx protobuf messages and core types, file helpers.
// Included only by onnx_frontend/*.cc (it pulls in the ONNX protobuf headers).
#pragma once

#include <string>

#include <onnx/onnx_pb.h>

#include "core/ir/ir.h"
#include "onnx_frontend/file_util.h"

namespace gspmd::frontend {

/// True when the tensor's data lives in an external file (data_location == EXTERNAL).
bool is_external(const onnx::TensorProto& t);
/// Shape of a TensorProto (its dims).
Shape proto_shape(const onnx::TensorProto& t);
/// Element type of a TensorProto; throws InputError("WHAT: unsupported element type N") for unknown types.
DType proto_dtype(int32_t data_type, const std::string& what);

/// Converts a TensorProto (raw_data, typed fields, or external data resolved against `base_dir`) into a Tensor.
/// `what` prefixes error messages (e.g. "model.onnx: initializer 'w'"). Throws InputError.
Tensor tensor_from_proto(const onnx::TensorProto& t, const std::string& base_dir, const std::string& what);
/// Fills `out` (dims, data_type, raw_data) from a Tensor; keeps out's name.
void tensor_to_proto(const Tensor& t, onnx::TensorProto* out);

}  // namespace gspmd::frontend
