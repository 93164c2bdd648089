// Tensor <-> onnx.TensorProto, test-data .pb I/O, file helpers shared by the frontend.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>

#include "onnx_frontend/frontend.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace frontend {

namespace {

/// True when `path` exists and is neither a regular file nor a directory (a FIFO, socket or device): opening a FIFO
/// blocks until a writer comes, and a device may never end, so such files are never read.
bool is_special_file(const std::filesystem::file_status& st) {
  return std::filesystem::exists(st) && !std::filesystem::is_regular_file(st) && !std::filesystem::is_directory(st);
}

/// An external tensor's `location` entry ("" when it has none).
std::string external_location(const onnx::TensorProto& p) {
  for (const auto& kv : p.external_data())
    if (kv.key() == "location") return kv.value();
  return "";
}

}  // namespace

std::string read_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);  // stat before open
  if (is_special_file(st)) throw InputError(fmt::format("{}: not a regular file (a FIFO, socket or device)", path));
  if (ec || !std::filesystem::is_regular_file(st)) throw InputError(fmt::format("{}: cannot open file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open file", path));
  std::string bytes;
  in.seekg(0, std::ios::end);
  auto size = in.tellg();
  if (size < 0) throw InputError(fmt::format("{}: cannot open file", path));
  bytes.resize(static_cast<size_t>(size));
  in.seekg(0, std::ios::beg);
  in.read(bytes.data(), size);
  if (!in) throw InputError(fmt::format("{}: cannot read file", path));
  return bytes;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(fmt::format("{}: cannot write file: {}", path, std::strerror(errno)));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      int err = errno;
      out.close();
      std::remove(tmp.c_str());
      throw InputError(fmt::format("{}: cannot write file: {}", path, std::strerror(err)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw InputError(fmt::format("{}: cannot write file: {}", path, std::strerror(err)));
  }
}

std::string dir_of(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void parse_model_file(const std::string& path, onnx::ModelProto* m) {
  const std::string bytes = read_file(path);
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX)));
  in.SetTotalBytesLimit(INT_MAX);
  if (bytes.size() > static_cast<size_t>(INT_MAX) || !m->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage() ||
      !m->has_graph())
    throw InputError(fmt::format("{}: not a valid ONNX model (truncated or malformed protobuf)", path));
}

bool is_external(const onnx::TensorProto& t) {
  return t.has_data_location() && t.data_location() == onnx::TensorProto::EXTERNAL;
}

Shape proto_shape(const onnx::TensorProto& t) { return Shape(t.dims().begin(), t.dims().end()); }

DType proto_dtype(int32_t data_type, const std::string& what) {
  switch (data_type) {
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
    case 8:
    case 9:
    case 10:
    case 11:
    case 12:
    case 13:
    case 16: return static_cast<DType>(data_type);
    default: throw InputError(fmt::format("{}: unsupported element type {}", what, data_type));
  }
}

namespace {

template <class Dst, class Field>
void copy_field(const Field& f, Tensor& t) {
  Dst* d = t.data<Dst>();
  for (int i = 0; i < f.size(); ++i) d[i] = static_cast<Dst>(f.Get(i));
}

// The external data of `p` (`n` elements of `dt`): the file, its size and the range checked before the tensor is
// allocated (a few bytes of model can declare a tensor of terabytes).
Tensor read_external(const onnx::TensorProto& p, DType dt, size_t n, ExternalDataFiles& files,
                     const std::string& what) {
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    try {
      if (kv.key() == "offset")
        offset = std::stoll(kv.value());
      else if (kv.key() == "length")
        length = std::stoll(kv.value());
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}: external data {} '{}' is not a number", what, kv.key(), kv.value()));
    }
  }
  const std::filesystem::path& file = files.file(p, what);
  const int64_t need = static_cast<int64_t>(n * dtype_size(dt));  // n <= 2^40 (tensor_from_proto)
  if (length >= 0 && length != need)
    throw InputError(fmt::format("{}: external data in '{}' is {} bytes but shape {} of {} needs {}", what,
                                 external_location(p), length, shape_str(proto_shape(p)), dtype_name(dt), need));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open external data file '{}'", what, file.string()));
  in.seekg(0, std::ios::end);
  int64_t fsize = static_cast<int64_t>(in.tellg());
  if (offset < 0 || need > fsize || offset > fsize - need)
    throw InputError(fmt::format("{}: external data file '{}' is {} bytes, too short for {} bytes at offset {}", what,
                                 file.string(), fsize, need, offset));
  Tensor t(dt, proto_shape(p));
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(t.bytes.data()), need);
  if (!in) throw InputError(fmt::format("{}: cannot read external data file '{}'", what, file.string()));
  return t;
}

}  // namespace

std::filesystem::path external_data_file(const onnx::TensorProto& p, const std::string& base_dir,
                                         const std::string& what) {
  namespace fs = std::filesystem;
  const std::string location = external_location(p);
  if (location.empty()) throw InputError(fmt::format("{}: external data has no location", what));
  // A NUL ends the path the OS sees ("\0x.bin" opened the model's folder itself, found by the tensor fuzzer)
  if (std::any_of(location.begin(), location.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
    throw InputError(
        fmt::format("{}: external data location '{}' has a control character", what, shown_bytes(location)));
  }
  const fs::path dir = base_dir.empty() ? fs::path(".") : fs::path(base_dir);
  if (fs::path(location).is_absolute() || fs::path(location).has_root_name())
    throw InputError(
        fmt::format("{}: external data location '{}' is an absolute path; it must be relative to the "
                    "model's folder '{}'",
                    what, cut_text(location), dir.string()));
  // Both sides resolved (symlinks followed, '.' and '..' removed) as far as they exist: the file must stay in the
  // folder, and the resolved path is the one read.
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(dir, ec);
  const fs::path file = ec ? fs::path() : fs::weakly_canonical(dir / location, ec);
  const fs::path rel = file.lexically_relative(root);
  if (ec || rel.empty() || *rel.begin() == ".." || rel.is_absolute())
    throw InputError(fmt::format("{}: external data location '{}' leaves the model's folder '{}'", what,
                                 cut_text(location), dir.string()));
  const fs::file_status st = fs::status(file, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))  // a FIFO would block, a folder has no size
    throw InputError(fmt::format("{}: external data file '{}' is not a regular file", what, file.string()));
  return file;
}

const std::filesystem::path& ExternalDataFiles::file(const onnx::TensorProto& t, const std::string& what) {
  const std::string location = external_location(t);
  auto it = files_.find(location);
  if (it == files_.end()) it = files_.emplace(location, external_data_file(t, base_dir_, what)).first;
  return it->second;
}

Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir, const std::string& what) {
  ExternalDataFiles files(base_dir);
  return tensor_from_proto(p, files, what);
}

Tensor tensor_from_proto(const onnx::TensorProto& p, ExternalDataFiles& files, const std::string& what) {
  DType dt = proto_dtype(p.data_type(), what);
  if (dt == DType::kString) throw InputError(fmt::format("{}: string tensors are not supported", what));
  for (auto d : p.dims())
    if (d < 0) throw InputError(fmt::format("{}: negative dimension {}", what, d));
  if (p.has_segment()) throw InputError(fmt::format("{}: segmented tensors are not supported", what));
  // Check the size before allocating: a message that is not a TensorProto (a sequence or optional .pb) can parse
  // into absurd dims.
  size_t n = 1;
  for (auto d : p.dims())
    if (__builtin_mul_overflow(n, static_cast<size_t>(d), &n) || n > (size_t{1} << 40))
      throw InputError(fmt::format("{}: shape {} is too large", what, shape_str(proto_shape(p))));
  if (!is_external(p) && p.has_raw_data() && p.raw_data().size() != n * dtype_size(dt))
    throw InputError(fmt::format("{}: raw_data has {} bytes but shape {} of {} needs {}", what, p.raw_data().size(),
                                 shape_str(proto_shape(p)), dtype_name(dt), n * dtype_size(dt)));
  if (!is_external(p) && !p.has_raw_data()) {
    const int have = dt == DType::kFloat32                          ? p.float_data_size()
                     : dt == DType::kFloat64                        ? p.double_data_size()
                     : dt == DType::kInt64                          ? p.int64_data_size()
                     : dt == DType::kUInt32 || dt == DType::kUInt64 ? p.uint64_data_size()
                                                                    : p.int32_data_size();
    if (static_cast<size_t>(have) != n)
      throw InputError(fmt::format("{}: tensor has {} elements of data but shape {} needs {}", what, have,
                                   shape_str(proto_shape(p)), n));
  }
  if (is_external(p)) return read_external(p, dt, n, files, what);
  Tensor t(dt, proto_shape(p));
  if (p.has_raw_data()) {
    if (!p.raw_data().empty()) std::memcpy(t.bytes.data(), p.raw_data().data(), t.nbytes());
    return t;
  }
  auto check = [&](int have) {
    if (static_cast<size_t>(have) != n)
      throw InputError(
          fmt::format("{}: tensor has {} elements of data but shape {} needs {}", what, have, shape_str(t.shape), n));
  };
  switch (dt) {
    case DType::kFloat32:
      check(p.float_data_size());
      copy_field<float>(p.float_data(), t);
      break;
    case DType::kFloat64:
      check(p.double_data_size());
      copy_field<double>(p.double_data(), t);
      break;
    case DType::kInt64:
      check(p.int64_data_size());
      copy_field<int64_t>(p.int64_data(), t);
      break;
    case DType::kInt32:
      check(p.int32_data_size());
      copy_field<int32_t>(p.int32_data(), t);
      break;
    case DType::kInt16:
      check(p.int32_data_size());
      copy_field<int16_t>(p.int32_data(), t);
      break;
    case DType::kInt8:
      check(p.int32_data_size());
      copy_field<int8_t>(p.int32_data(), t);
      break;
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      check(p.int32_data_size());
      copy_field<uint16_t>(p.int32_data(), t);
      break;
    case DType::kUInt8:
      check(p.int32_data_size());
      copy_field<uint8_t>(p.int32_data(), t);
      break;
    case DType::kBool: {
      check(p.int32_data_size());
      uint8_t* d = t.data<uint8_t>();
      for (int i = 0; i < p.int32_data_size(); ++i) d[i] = p.int32_data(i) != 0;
      break;
    }
    case DType::kUInt32:
      check(p.uint64_data_size());
      copy_field<uint32_t>(p.uint64_data(), t);
      break;
    case DType::kUInt64:
      check(p.uint64_data_size());
      copy_field<uint64_t>(p.uint64_data(), t);
      break;
    default: throw InputError(fmt::format("{}: unsupported element type {}", what, dtype_name(dt)));
  }
  return t;
}

void tensor_to_proto(const Tensor& t, onnx::TensorProto* out) {
  out->clear_dims();
  for (int64_t d : t.shape) out->add_dims(d);
  out->set_data_type(static_cast<int32_t>(t.dtype));
  out->clear_external_data();
  out->clear_data_location();
  out->clear_float_data();
  out->clear_int32_data();
  out->clear_int64_data();
  out->clear_double_data();
  out->clear_uint64_data();
  out->set_raw_data(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

}  // namespace frontend

Tensor read_tensor_pb(const std::string& path) {
  std::string bytes = frontend::read_file(path);
  onnx::TensorProto p;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw InputError(fmt::format("{}: not a valid serialized onnx.TensorProto", path));
  std::string what = p.name().empty() ? path : fmt::format("{}: tensor '{}'", path, p.name());
  return frontend::tensor_from_proto(p, frontend::dir_of(path), what);
}

void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name) {
  onnx::TensorProto p;
  p.set_name(name);
  frontend::tensor_to_proto(t, &p);
  std::string bytes;
  if (!p.SerializeToString(&bytes))
    throw UnsupportedError(fmt::format("{}: cannot serialize the tensor (over protobuf's 2 GiB limit)", path));
  frontend::write_file_atomic(path, bytes);
}

}  // namespace gspmd
