// Why poll before accept and connect: a rendezvous must give up at its deadline with an error that
// says who never came, never block forever in the kernel.
#include "executor/comm/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "frontend/ir/status.h"

namespace onnxpipe::comm {
namespace {

std::string Errno() { return std::strerror(errno); }

int MillisUntil(Deadline d) {
  if (d == Deadline::max()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - std::chrono::steady_clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Deadline DeadlineIn(double seconds) {
  if (seconds <= 0) return Deadline::max();
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.Release();
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

int Socket::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::ShutdownWrite() const {
  if (fd_ >= 0) shutdown(fd_, SHUT_WR);
}

void Socket::ShutdownBoth() const {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

absl::StatusOr<Socket> Listen(const std::string& addr, int port, int backlog) {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return COMM_ERROR(kUnavailable) << "socket(): " << Errno();
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!addr.empty() && addr != "0.0.0.0" && inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    return INVALID_ARGUMENT() << "cannot listen on '" << addr << "': not an IPv4 address";
  }
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return COMM_ERROR(kUnavailable) << "cannot listen on " << (addr.empty() ? "0.0.0.0" : addr) << ":" << port << ": "
                                    << Errno();
  }
  if (listen(s.fd(), backlog) != 0) return COMM_ERROR(kUnavailable) << "listen(): " << Errno();
  return s;
}

absl::StatusOr<int> BoundPort(const Socket& s) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) return COMM_ERROR(kUnavailable) << Errno();
  return static_cast<int>(ntohs(sa.sin_port));
}

namespace {
absl::StatusOr<std::string> AddressOf(const Socket& s, bool peer) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  const int r = peer ? getpeername(s.fd(), reinterpret_cast<sockaddr*>(&sa), &len)
                     : getsockname(s.fd(), reinterpret_cast<sockaddr*>(&sa), &len);
  if (r != 0) return COMM_ERROR(kUnavailable) << Errno();
  char buf[INET_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf)) == nullptr) return COMM_ERROR(kUnavailable) << Errno();
  return std::string(buf);
}
}  // namespace

absl::StatusOr<std::string> LocalAddress(const Socket& s) { return AddressOf(s, /*peer=*/false); }
absl::StatusOr<std::string> PeerAddress(const Socket& s) { return AddressOf(s, /*peer=*/true); }

absl::StatusOr<Socket> Accept(const Socket& listener, Deadline deadline) {
  for (;;) {
    pollfd p{listener.fd(), POLLIN, 0};
    const int r = poll(&p, 1, MillisUntil(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return COMM_ERROR(kUnavailable) << "poll(): " << Errno();
    if (r == 0) return COMM_ERROR(kDeadlineExceeded) << "no connection before the deadline";
    Socket c(accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return COMM_ERROR(kUnavailable) << "accept(): " << Errno();
    }
    NoDelay(c.fd());
    return c;
  }
}

absl::StatusOr<Socket> Connect(const std::string& host, int port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last = "no attempt";
  for (;;) {
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve '") + host + "': " + gai_strerror(gai);
    } else {
      Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const int r = s.valid() ? connect(s.fd(), res->ai_addr, res->ai_addrlen) : -1;
      last = Errno();
      freeaddrinfo(res);
      if (r == 0) {
        NoDelay(s.fd());
        return s;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return COMM_ERROR(kDeadlineExceeded) << "cannot connect to " << host << ":" << port << " (" << last << ")";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

absl::Status WriteAll(const Socket& s, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(s.fd(), p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return COMM_ERROR(kUnavailable) << what << ": " << Errno();
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(const Socket& s, void* data, size_t n, const std::string& what, Deadline deadline) {
  char* p = static_cast<char*>(data);
  const size_t total = n;
  while (n > 0) {
    if (deadline != Deadline::max()) {
      pollfd pf{s.fd(), POLLIN, 0};
      const int r = poll(&pf, 1, MillisUntil(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return COMM_ERROR(kDeadlineExceeded) << what << ": nothing arrived before the deadline";
    }
    const ssize_t r = recv(s.fd(), p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && n == total) return NOT_FOUND() << what << ": the peer closed the connection";
    if (r == 0) return COMM_ERROR(kUnavailable) << what << ": the connection ended in the middle of a message";
    if (r < 0) return COMM_ERROR(kUnavailable) << what << ": " << Errno();
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

absl::Status WriteString(const Socket& s, const std::string& v, const std::string& what) {
  std::string buf;
  PutU64(buf, v.size());
  buf += v;
  return WriteAll(s, buf.data(), buf.size(), what);
}

absl::StatusOr<std::string> ReadString(const Socket& s, const std::string& what, Deadline deadline,
                                       uint64_t max_bytes) {
  char len[8];
  RETURN_IF_ERROR(ReadAll(s, len, 8, what, deadline));
  const uint64_t n = GetU64(len);
  if (n > max_bytes)
    return COMM_ERROR(kDataLoss) << what << ": a string of " << n << " bytes (at most " << max_bytes << ")";
  std::string v(n, '\0');
  if (n > 0) RETURN_IF_ERROR(ReadAll(s, v.data(), n, what, deadline));
  return v;
}

}  // namespace onnxpipe::comm
