// ONNX's checker and protobuf classes for the frontend tests that parse exported models back.
// The frontend links onnx privately; its headers need these definitions (the onnx target sets them for its users).
#pragma once

#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
