// onnx_frontend internal: conversions between onnx protobuf messages and core types, file helpers.
// Included only by onnx_frontend/*.cc (it pulls in the ONNX protobuf headers).
#pragma once

#include <filesystem>
#include <string>
#include <unordered_map>
#include <utility>

#include <onnx/onnx_pb.h>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"
#include "onnx_frontend/file_util.h"

namespace gspmd::frontend {

/// True when the tensor's data lives in an external file (data_location == EXTERNAL).
bool is_external(const onnx::TensorProto& t);
/// Shape of a TensorProto (its dims).
Shape proto_shape(const onnx::TensorProto& t);
/// Element type of a TensorProto; throws InputError("WHAT: unsupported element type N") for unknown types.
DType proto_dtype(int32_t data_type, const std::string& what);

/// Parses the ONNX model file at `path` into `m` (models up to protobuf's 2 GiB limit). Throws
/// InputError("PATH: cannot open file") or InputError("PATH: not a valid ONNX model (truncated or malformed
/// protobuf)"), also for a message without a graph.
void parse_model_file(const std::string& path, onnx::ModelProto* m);

/// True when `m` carries ONNX's multi-device annotations (ModelProto.configuration or a top-level node's
/// device_configurations; onnx 1.12 keeps them as unknown fields 26 and 10). annotated_model.cc.
bool has_sharding_annotations(const onnx::ModelProto& m);
/// Sets `m`'s metadata_props gspmd.mesh_shape ("2x2"), gspmd.mesh_axes ("data,model"; a refined mesh's parts as
/// "x:(1)2") and, for a mesh with a device order, gspmd.mesh_devices ("0,2,1,3") to `mesh`, replacing existing
/// entries (docs/collectives.md). annotated_model.cc.
void set_mesh_metadata(onnx::ModelProto& m, const DeviceMesh& mesh);

/// The file of an external tensor's data: its `location` resolved against `base_dir` (the model's folder), symlinks
/// followed and '.' and '..' removed (the path to read). A model
/// comes from strangers, so the location must be a relative path that stays inside that folder, symlinks resolved
/// (onnx's CVE-2022-25882): throws InputError("WHAT: external data location '../x' leaves the model's folder 'DIR'"),
/// ("... is an absolute path; it must be relative to the model's folder 'DIR'"), ("... has no location"), or, for a
/// file that exists but is a folder, FIFO, socket or device, ("WHAT: external data file 'F' is not a regular file").
std::filesystem::path external_data_file(const onnx::TensorProto& t, const std::string& base_dir,
                                         const std::string& what);

/// The external data files of one model: external_data_file's answer for each location, resolved once (a model's
/// weights mostly share one file: the GPT-3 decoder's 1,541 all live in gpt3.bin, and resolving a path costs a system
/// call per component). Only accepted locations are kept; a refused one throws each time it is asked.
class ExternalDataFiles {
 public:
  /// `base_dir`: the model's folder ("" = the current directory).
  explicit ExternalDataFiles(std::string base_dir) : base_dir_(std::move(base_dir)) {}
  /// external_data_file(t, base_dir, what), from the cache after its location's first call. Throws as it does.
  const std::filesystem::path& file(const onnx::TensorProto& t, const std::string& what);
  const std::string& base_dir() const { return base_dir_; }

 private:
  std::string base_dir_;
  std::unordered_map<std::string, std::filesystem::path> files_;  // by location
};

/// tensor_from_proto with the external data files resolved through `files` (the loader's, one per model).
Tensor tensor_from_proto(const onnx::TensorProto& t, ExternalDataFiles& files, const std::string& what);

/// Converts a TensorProto (raw_data, typed fields, or external data resolved against `base_dir`) into a Tensor.
/// `what` prefixes error messages (e.g. "model.onnx: initializer 'w'"). Throws InputError.
Tensor tensor_from_proto(const onnx::TensorProto& t, const std::string& base_dir, const std::string& what);
/// Fills `out` (dims, data_type, raw_data) from a Tensor; keeps out's name.
void tensor_to_proto(const Tensor& t, onnx::TensorProto* out);

}  // namespace gspmd::frontend
