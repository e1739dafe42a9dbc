// The pipelined streaming engine (see ring.hpp).
#include "ring.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace distopt::plugins::tcp {
namespace {

std::string lost(int peer, int err) {
  std::string why = err == 0            ? "peer closed"
                    : err == ECONNRESET ? "connection reset"
                    : err == EPIPE      ? "broken pipe"
                                        : std::strerror(err);
  return "connection to rank " + std::to_string(peer) + " lost (" + why + ")";
}

}  // namespace

RingResult run_ring(const RingPlan& plan, const RingIo& io) {
  RingResult res;
  size_t total_send = 0, total_recv = 0;
  for (const auto& s : plan.sends) total_send += s.len;
  for (const auto& r : plan.recvs) total_recv += r.len;
  const size_t esz = dtype_size(plan.dtype);

  size_t sent = 0, si = 0, soff = 0;  // send stream position
  size_t recv_done = 0, ri = 0, roff = 0,
         rdone = 0;  // receive stream: finished bytes; segment; received/reduced in it
  auto skip_empty = [&] {
    while (si < plan.sends.size() && soff == plan.sends[si].len) ++si, soff = 0;
    while (ri < plan.recvs.size() && roff == plan.recvs[ri].len) ++ri, roff = rdone = 0;
  };
  skip_empty();

  while (sent < total_send || recv_done < total_recv) {
    bool progress = false;
    bool want_out = false, want_in = false;

    // Send whatever the dependency allows.
    if (sent < total_send) {
      size_t allowed = plan.send_free + recv_done;
      if (allowed > total_send) allowed = total_send;
      if (allowed > sent) {
        const SendSeg& s = plan.sends[si];
        size_t n = s.len - soff;
        if (n > allowed - sent) n = allowed - sent;
        if (n > io.max_io) n = io.max_io;
        ssize_t k = ::send(io.send_fd, s.src + soff, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
          sent += static_cast<size_t>(k);
          soff += static_cast<size_t>(k);
          progress = true;
          if (io.fault) io.fault->sent(static_cast<uint64_t>(k));
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          want_out = true;
        } else {
          res.status = DOPT_ERR_COMM;
          res.why = lost(plan.send_peer, k == 0 ? 0 : errno);
          res.peer = plan.send_peer;
          return res;
        }
      }
    }

    // Receive, then reduce or copy what arrived.
    if (recv_done < total_recv) {
      const RecvSeg& r = plan.recvs[ri];
      ssize_t k;
      if (!r.local) {
        size_t n = r.len - roff;
        if (n > io.max_io) n = io.max_io;
        k = ::recv(io.recv_fd, r.dst + roff, n, MSG_DONTWAIT);
        if (k > 0) {
          roff += static_cast<size_t>(k);
          rdone = roff;
          recv_done += static_cast<size_t>(k);
        }
      } else {
        // Staging holds a window of the segment; bytes [rdone, roff) are
        // received but not yet reduced (less than one element).
        size_t off = roff % io.staging_bytes;
        size_t n = io.staging_bytes - off;
        if (n > r.len - roff) n = r.len - roff;
        k = ::recv(io.recv_fd, io.staging + off, n, MSG_DONTWAIT);
        if (k > 0) {
          roff += static_cast<size_t>(k);
          size_t upto = roff - roff % esz;
          if (upto > rdone) {
            size_t count = (upto - rdone) / esz;
            size_t soff_st = rdone % io.staging_bytes;
            reduce(plan.dtype, plan.op, r.dst + rdone, r.local + rdone, io.staging + soff_st, count,
                   r.divisor);
            recv_done += upto - rdone;
            rdone = upto;
          }
        }
      }
      if (k > 0) {
        res.bytes_received += static_cast<uint64_t>(k);
        progress = true;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        want_in = true;
      } else {
        res.status = DOPT_ERR_COMM;
        res.why = lost(plan.recv_peer, k == 0 ? 0 : errno);
        res.peer = plan.recv_peer;
        return res;
      }
    }
    skip_empty();
    if (progress) continue;

    if (io.abort && io.abort->load(std::memory_order_relaxed)) {
      res.status = DOPT_ERR_ABORTED;
      res.why = "communicator failed";
      return res;
    }
    if (Clock::now() >= io.deadline) {
      res.status = DOPT_ERR_TIMEOUT;
      int peer = recv_done < total_recv ? plan.recv_peer : plan.send_peer;
      res.why = "timed out waiting for rank " + std::to_string(peer);
      return res;
    }
    pollfd pf[3];
    int np = 0;
    if (want_out) pf[np++] = {io.send_fd, POLLOUT, 0};
    if (want_in) {
      if (np == 1 && io.recv_fd == io.send_fd)
        pf[0].events |= POLLIN;
      else
        pf[np++] = {io.recv_fd, POLLIN, 0};
    }
    if (np == 0) {
      res.status = DOPT_ERR_INTERNAL;
      res.why = "ring engine stalled (send stream waits on a receive stream that is complete)";
      return res;
    }
    if (io.abort_fd >= 0) pf[np++] = {io.abort_fd, POLLIN, 0};
    poll(pf, static_cast<nfds_t>(np), poll_ms(io.deadline, 500));
  }
  res.bytes_sent = sent;
  return res;
}

}  // namespace distopt::plugins::tcp
