#include "tests/passes/test_util.h"

#include <sstream>

#include "frontend/ir/status.h"

namespace onnxpipe::passes::testing {

ir::ValueId GraphBuilder::Input(const std::string& name, ir::Shape shape, ir::DType dtype) {
  ir::ValueId v = g_.AddValue(name, dtype, std::move(shape));
  g_.inputs().push_back(v);
  return v;
}

ir::ValueId GraphBuilder::Param(const std::string& name, std::vector<int64_t> dims, float scale) {
  ir::Tensor t(ir::DType::kF32, dims);
  float* p = t.mutable_data<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    seed_ = seed_ * 1664525u + 1013904223u;
    p[i] = scale * (static_cast<float>(seed_ >> 8) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return g_.AddConstant(name, t, /*is_initializer=*/true);
}

ir::ValueId GraphBuilder::Const(const std::string& name, ir::Tensor t) {
  return g_.AddConstant(name, std::move(t), /*is_initializer=*/false);
}

ir::ValueId GraphBuilder::Scalar(float v) {
  return Const("c" + std::to_string(counter_++), ir::Tensor::Scalar<float>(v));
}

ir::ValueId GraphBuilder::IntVec(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Const("i" + std::to_string(counter_++), ir::Tensor::FromVector<int64_t>({n}, v));
}

ir::ValueId GraphBuilder::Op(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Shape out_shape,
                             ir::Attrs attrs, ir::DType dtype) {
  const std::string name = "/l/" + std::string(ir::OpName(op)) + "_" + std::to_string(counter_++);
  ir::ValueId out = g_.AddValue(name + "_output_0", dtype, std::move(out_shape));
  last_node_ = g_.AddNode(op, name, std::move(inputs), {out}, std::move(attrs));
  return out;
}

ir::Attrs MakeAttrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

std::map<std::string, int> Histogram(const ir::Graph& g) {
  std::map<std::string, int> h;
  for (ir::NodeId id : g.LiveNodes()) ++h[std::string(ir::OpName(g.node(id).op))];
  return h;
}

std::string HistogramString(const ir::Graph& g) {
  std::ostringstream os;
  for (const auto& [op, n] : Histogram(g)) os << op << ":" << n << " ";
  return os.str();
}

std::vector<const ir::Node*> NodesOf(const ir::Graph& g, ir::OpKind op) {
  std::vector<const ir::Node*> out;
  for (ir::NodeId id : g.LiveNodes())
    if (g.node(id).op == op) out.push_back(&g.node(id));
  return out;
}

namespace {

// Elementwise binary op on f32/i64/bool with same shapes or a one-element operand.
template <typename T, typename R, typename F>
ir::Tensor Binary(const ir::Tensor& a, const ir::Tensor& b, F f) {
  const ir::Tensor& big = a.num_elements() >= b.num_elements() ? a : b;
  ir::Tensor out(ir::DTypeOf<R>::value, big.dims());
  for (int64_t i = 0; i < big.num_elements(); ++i) {
    T x = a.data<T>()[a.num_elements() == 1 ? 0 : i];
    T y = b.data<T>()[b.num_elements() == 1 ? 0 : i];
    out.mutable_data<R>()[i] = f(x, y);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ir::Tensor>> TinyEvaluator::Evaluate(
    const ir::Node& n, const std::vector<ir::Tensor>& in) const {
  ++calls;
  switch (n.op) {
    case ir::OpKind::kAdd:
    case ir::OpKind::kSub:
    case ir::OpKind::kMul:
    case ir::OpKind::kDiv: {
      if (in[0].dtype() != in[1].dtype() ||
          (in[0].num_elements() != in[1].num_elements() && in[0].num_elements() != 1 &&
           in[1].num_elements() != 1)) {
        return UNIMPLEMENTED() << "TinyEvaluator: broadcast";
      }
      auto apply = [&](auto x, auto y) -> decltype(x) {
        switch (n.op) {
          case ir::OpKind::kAdd: return x + y;
          case ir::OpKind::kSub: return x - y;
          case ir::OpKind::kMul: return x * y;
          default: return x / y;
        }
      };
      if (in[0].dtype() == ir::DType::kF32)
        return std::vector<ir::Tensor>{Binary<float, float>(in[0], in[1], apply)};
      if (in[0].dtype() == ir::DType::kI64)
        return std::vector<ir::Tensor>{Binary<int64_t, int64_t>(in[0], in[1], apply)};
      return UNIMPLEMENTED() << "TinyEvaluator: dtype";
    }
    case ir::OpKind::kEqual: {
      if (in[0].dtype() != ir::DType::kF32 || in[1].dtype() != ir::DType::kF32)
        return UNIMPLEMENTED() << "TinyEvaluator: Equal dtype";
      return std::vector<ir::Tensor>{
          Binary<float, bool>(in[0], in[1], [](float x, float y) { return x == y; })};
    }
    case ir::OpKind::kCast: {
      auto to = ir::ParseDType(n.attrs.Get<std::string>("to"));
      if (!to) return INVALID_ARGUMENT() << "bad Cast to";
      return std::vector<ir::Tensor>{in[0].CastTo(*to)};
    }
    case ir::OpKind::kGather: {
      if (in[0].rank() != 1) return UNIMPLEMENTED() << "TinyEvaluator: Gather rank";
      std::vector<int64_t> idx = in[1].ToInt64Vector();
      ir::Tensor out(in[0].dtype(), in[1].dims());
      const int64_t size = ir::DTypeSize(in[0].dtype());
      for (size_t i = 0; i < idx.size(); ++i) {
        int64_t k = idx[i] < 0 ? idx[i] + in[0].num_elements() : idx[i];
        if (k < 0 || k >= in[0].num_elements()) return INVALID_ARGUMENT() << "Gather index out of range";
        std::memcpy(static_cast<char*>(out.raw()) + i * size,
                    static_cast<const char*>(in[0].raw()) + k * size, size);
      }
      return std::vector<ir::Tensor>{out};
    }
    case ir::OpKind::kUnsqueeze: {
      std::vector<int64_t> axes = n.attrs.Get<std::vector<int64_t>>("axes");
      std::vector<int64_t> dims = in[0].dims();
      const int64_t rank = static_cast<int64_t>(dims.size() + axes.size());
      std::vector<int64_t> norm;
      for (int64_t a : axes) norm.push_back(a < 0 ? a + rank : a);
      std::sort(norm.begin(), norm.end());
      for (int64_t a : norm) dims.insert(dims.begin() + a, 1);
      return std::vector<ir::Tensor>{in[0].Clone().Reshaped(dims)};
    }
    case ir::OpKind::kConcat: {
      int64_t total = 0;
      for (const ir::Tensor& t : in) {
        if (t.rank() != 1 || t.dtype() != in[0].dtype()) return UNIMPLEMENTED() << "TinyEvaluator: Concat";
        total += t.num_elements();
      }
      ir::Tensor out(in[0].dtype(), {total});
      int64_t off = 0;
      for (const ir::Tensor& t : in) {
        std::memcpy(static_cast<char*>(out.raw()) + off, t.raw(), t.num_bytes());
        off += t.num_bytes();
      }
      return std::vector<ir::Tensor>{out};
    }
    case ir::OpKind::kNeg: {
      if (in[0].dtype() != ir::DType::kF32) return UNIMPLEMENTED() << "TinyEvaluator: Neg";
      ir::Tensor out = in[0].Clone();
      for (int64_t i = 0; i < out.num_elements(); ++i) out.mutable_data<float>()[i] *= -1;
      return std::vector<ir::Tensor>{out};
    }
    default:
      return UNIMPLEMENTED() << "TinyEvaluator: " << ir::OpName(n.op);
  }
}

}  // namespace onnxpipe::passes::testing
