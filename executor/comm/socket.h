// Small POSIX TCP helpers for the CPU transport and the rendezvous: listening, connecting with
// retries until a deadline, and whole-buffer reads and writes. Errors are absl::Status naming the
// address and the system error; writes never raise SIGPIPE (a dead peer is an error, not a signal).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/status.h"

// A status of `code` (an absl::StatusCode enumerator) built with <<, as INVALID_ARGUMENT() is.
#define COMM_ERROR(code) ::onnxpipe::StatusBuilder(::absl::StatusCode::code, __FILE__, __LINE__)

namespace onnxpipe::comm {

using Deadline = std::chrono::steady_clock::time_point;
Deadline DeadlineIn(double seconds);

// An owned file descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.Release()) {}
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  // Stops further writes (the peer reads EOF after what was sent).
  void ShutdownWrite() const;
  // Wakes a thread blocked reading it (both directions shut down).
  void ShutdownBoth() const;

 private:
  int fd_ = -1;
};

// Listens on `addr`:`port` (addr "" or "0.0.0.0": every interface; port 0: an ephemeral port).
absl::StatusOr<Socket> Listen(const std::string& addr, int port, int backlog = 128);
// The port a listening socket is bound to.
absl::StatusOr<int> BoundPort(const Socket& s);
// The local address of a connected socket (the interface that reaches its peer), as text.
absl::StatusOr<std::string> LocalAddress(const Socket& s);
// The address of a connected socket's peer, as text.
absl::StatusOr<std::string> PeerAddress(const Socket& s);
// Accepts one connection; DeadlineExceeded after `deadline`.
absl::StatusOr<Socket> Accept(const Socket& listener, Deadline deadline);
// Connects to host:port, retrying refused connections (the peer may not listen yet) until `deadline`.
absl::StatusOr<Socket> Connect(const std::string& host, int port, Deadline deadline);

// Writes all `n` bytes (blocking). An error names `what`.
absl::Status WriteAll(const Socket& s, const void* data, size_t n, const std::string& what);
// Reads exactly `n` bytes. Returns NotFound for a clean end of stream before the first byte (the
// peer closed), Unavailable when the stream ends mid-message or fails. With a deadline, waits no longer.
absl::Status ReadAll(const Socket& s, void* data, size_t n, const std::string& what,
                     Deadline deadline = Deadline::max());

// Little-endian fixed-width integers and length-prefixed strings, for the wire formats.
void PutU64(std::string& out, uint64_t v);
uint64_t GetU64(const char* p);
absl::Status WriteString(const Socket& s, const std::string& v, const std::string& what);
absl::StatusOr<std::string> ReadString(const Socket& s, const std::string& what, Deadline deadline = Deadline::max(),
                                       uint64_t max_bytes = 1 << 20);

}  // namespace onnxpipe::comm
