// Kernel registry: a fixed table indexed by OpKind, filled by static initialisers. The table is a
// function-local static so registration works whatever order the objects are initialised in.
#include "executor/cpu/kernel.h"

#include <array>
#include <cstdio>
#include <cstdlib>

namespace onnxpipe::cpu {

namespace {
struct Entry {
  CpuKernelFn fn = nullptr;
  const char* file = nullptr;
};
std::array<Entry, static_cast<size_t>(ir::OpKind::kNumOps)>& Table() {
  static std::array<Entry, static_cast<size_t>(ir::OpKind::kNumOps)> table;
  return table;
}
}  // namespace

bool RegisterCpuKernel(ir::OpKind op, CpuKernelFn fn, const char* file) {
  Entry& e = Table()[static_cast<size_t>(op)];
  if (e.fn != nullptr) {
    // Two kernels for one op is a build error in spirit; fail loudly before anything runs.
    std::fprintf(stderr, "onnxpipe: CPU kernel for op %s registered twice (%s and %s)\n",
                 std::string(ir::OpName(op)).c_str(), e.file, file);
    std::abort();
  }
  e.fn = fn;
  e.file = file;
  return true;
}

CpuKernelFn FindCpuKernel(ir::OpKind op) {
  if (static_cast<size_t>(op) >= Table().size()) return nullptr;
  return Table()[static_cast<size_t>(op)].fn;
}

}  // namespace onnxpipe::cpu
