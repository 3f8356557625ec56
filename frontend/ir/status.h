// Error-propagation helpers on top of absl::Status (absl 20220623 has no status_macros.h).
//   RETURN_IF_ERROR(expr);              returns the status if not OK.
//   ASSIGN_OR_RETURN(auto x, expr);     unwraps a StatusOr or returns its status.
//   RET_CHECK(cond) << "why";           returns an Internal error naming the failed invariant.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe {

// Streams a message into a Status when it goes out of scope as a return value.
class StatusBuilder {
 public:
  StatusBuilder(absl::StatusCode code, const char* file, int line) : code_(code) {
    if (code == absl::StatusCode::kInternal) os_ << file << ":" << line << ": ";
  }
  template <typename T>
  StatusBuilder& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  operator absl::Status() const { return absl::Status(code_, os_.str()); }
  template <typename T>
  operator absl::StatusOr<T>() const {
    return absl::Status(code_, os_.str());
  }

 private:
  absl::StatusCode code_;
  std::ostringstream os_;
};

// Appends context ("while importing node X: ") to a non-OK status.
inline absl::Status Annotate(const absl::Status& s, const std::string& context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), context + ": " + std::string(s.message()));
}

}  // namespace onnxpipe

#define ONNXPIPE_CONCAT_INNER(a, b) a##b
#define ONNXPIPE_CONCAT(a, b) ONNXPIPE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _onnxpipe_st = (expr);          \
    if (!_onnxpipe_st.ok()) return _onnxpipe_st;   \
  } while (0)

#define ONNXPIPE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ONNXPIPE_ASSIGN_OR_RETURN_IMPL(ONNXPIPE_CONCAT(_onnxpipe_so_, __LINE__), lhs, expr)

#define RET_CHECK(cond)                                                                   \
  if (cond) {                                                                             \
  } else /* NOLINT */                                                                     \
    return ::onnxpipe::StatusBuilder(::absl::StatusCode::kInternal, __FILE__, __LINE__) \
           << "check failed: " #cond " "

#define INVALID_ARGUMENT() \
  ::onnxpipe::StatusBuilder(::absl::StatusCode::kInvalidArgument, __FILE__, __LINE__)
#define UNIMPLEMENTED() \
  ::onnxpipe::StatusBuilder(::absl::StatusCode::kUnimplemented, __FILE__, __LINE__)
#define FAILED_PRECONDITION() \
  ::onnxpipe::StatusBuilder(::absl::StatusCode::kFailedPrecondition, __FILE__, __LINE__)
#define NOT_FOUND() ::onnxpipe::StatusBuilder(::absl::StatusCode::kNotFound, __FILE__, __LINE__)
