// The training step's loss from the model's output 0 (--loss, docs/training.md): the output itself, its mean or sum,
// or the cross-entropy of logits against integer labels (torch.nn.functional.cross_entropy, reduction "mean").
#include "core/autodiff/step_builder.h"

namespace gspmd::autodiff {

int build_loss(StepBuilder& b, const TrainingOptions& o) {
  Graph& g = b.g();
  if (g.outputs.empty()) throw InputError("--training: the model has no output");
  int out = g.outputs[0];
  Value y = g.values.at(static_cast<size_t>(out));  // a copy: emitting appends to g.values
  if (!is_floating(y.dtype))
    throw InputError(fmt::format("--training: output 0 '{}' is {}, not floating point", y.name, dtype_name(y.dtype)));
  if (y.dtype == DType::kFloat16 || y.dtype == DType::kBFloat16) {  // the loss in float32, as torch's autocast
    out = b.cast(out, DType::kFloat32);
    y.dtype = DType::kFloat32;
  }
  const auto all_axes = [&](int v) {
    std::vector<int64_t> axes;
    for (size_t d = 0; d < b.value(v).shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
    return axes;
  };
  switch (o.loss) {
    case LossKind::kOutput:
      if (num_elements(y.shape) != 1)
        throw InputError(
            fmt::format("--training: output 0 '{}' is {}, not a scalar: choose --loss mean, sum or "
                        "cross-entropy:LABELS",
                        y.name, type_str(y.dtype, y.shape)));
      return out;
    case LossKind::kSum: return b.reduce_sum(out, all_axes(out), false);
    case LossKind::kMean: {
      const int s = b.reduce_sum(out, all_axes(out), false);
      return b.op("Div", {s, b.scalar(static_cast<double>(num_elements(y.shape)), y.dtype)});
    }
    case LossKind::kCrossEntropy: {
      if (y.shape.empty())
        throw InputError(fmt::format("--loss cross-entropy: output 0 '{}' is a scalar, not logits", y.name));
      const Shape logits_shape = y.shape;
      const DType dt = y.dtype;
      const int64_t classes = logits_shape.back();
      const Shape label_shape(logits_shape.begin(), logits_shape.end() - 1);
      int labels = g.find(o.labels);
      if (labels < 0) {
        labels =
            g.add_value(Value{o.labels, ValueKind::kTensor, DType::kInt64, label_shape, -1, false, nullptr, nullptr});
        g.inputs.push_back(labels);
      } else {
        const Value& l = g.values.at(static_cast<size_t>(labels));
        const bool integer = l.dtype == DType::kInt64 || l.dtype == DType::kInt32;
        if (!integer || l.shape != label_shape)
          throw InputError(fmt::format(
              "--loss cross-entropy:{}: the labels are {}, not int64 or int32 {} (output 0 '{}' is {})", o.labels,
              type_str(l.dtype, l.shape), shape_str(label_shape), y.name, type_str(dt, logits_shape)));
      }
      const int64_t last = static_cast<int64_t>(logits_shape.size()) - 1;
      const int logp = b.op("LogSoftmax", {out}, {{"axis", last}});
      const int onehot = b.one_hot(labels, classes, -1, dt);
      const int picked = b.reduce_sum(b.op("Mul", {logp, onehot}), {last}, false);
      const int total = b.reduce_sum(picked, all_axes(picked), false);
      return b.op("Div", {total, b.scalar(-static_cast<double>(num_elements(label_shape)), dt)});
    }
  }
  return -1;
}

}  // namespace gspmd::autodiff
