// sdk::p2p::Transport over the tcp mesh's one-way data connections, so the
// TCP path runs the SDK's collective algorithms (sdk/collective/p2p_collectives.hpp).
//
// Wire format on out[p] -> in[p]: frames of a 16-byte header {tag, length}
// then `length` payload bytes, in isend order. The receiver matches each
// header against its posted receives of that peer (first posted with the
// tag wins) and streams the payload straight into the matched buffer; a
// frame nobody waits for yet goes to a heap buffer and is matched by a later
// irecv (the sender may run a collective ahead). A frame whose header
// matches no posted receive is first held: its payload stays in the socket
// (a sender running ahead is slowed by TCP's flow control) until an irecv
// claims it, and is read into the heap only when wait_all has nothing else
// to do (a receive further down that stream may be waited on). Only peers
// with a posted receive are read.
//
// The I/O is split into small handlers as Gloo's tcp::Pair does: write_frames
// (sender), read_header / on_header / start_payload / read_payload /
// on_frame (receiver), buffer_held, fail_peer (a broken connection),
// wait_for_io (poll). There are no locks:
// every member, handlers included, runs on the one thread that owns the
// transport (the communicator's progress thread); the only state shared
// with other threads is the abort flag and its eventfd, both read-only here.
//
// Errors (thrown by test/wait_all as sdk::Error): DOPT_ERR_COMM
// "connection to rank 2 lost (peer closed)"; DOPT_ERR_TIMEOUT "timed out
// waiting for rank 1"; DOPT_ERR_ABORTED once the abort flag is set (after
// a grace period, see Options::abort);
// DOPT_ERR_INTERNAL for a frame whose length differs from the receive's.
// After any of these the communicator is failed for good (tcp never reuses
// a transport after an error), so a connection with an abandoned,
// half-transferred frame is simply marked broken.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "distopt/sdk/base/fault_point.hpp"
#include "distopt/sdk/transport/p2p_transport.hpp"

namespace distopt::plugins::tcp {

class SocketTransport final : public sdk::p2p::Transport {
 public:
  using Handle = sdk::p2p::Handle;
  using Clock = sdk::p2p::Clock;

  struct Options {
    size_t max_io = 4u << 20;  ///< bytes per send()/recv() call
    /// Set when the communicator failed (a peer died, a timeout): a wait
    /// goes on while bytes still move (abort_idle without any ends it) for
    /// at most abort_grace, so an operation whose data is all in the
    /// sockets still completes (a rank that died just after finishing it
    /// does not fail it on the slower ranks), then throws ABORTED.
    const std::atomic<bool>* abort = nullptr;
    /// Set when the communicator is destroyed: ABORTED at once.
    const std::atomic<bool>* destroy = nullptr;
    int abort_fd = -1;  ///< eventfd made readable together with *abort
    Clock::duration abort_grace = std::chrono::seconds(1);
    Clock::duration abort_idle = std::chrono::milliseconds(200);
    sdk::FaultPoint* fault = nullptr;  ///< told about every byte sent (tests only)
  };

  /// out[p] / in[p]: non-blocking one-way connections to / from rank p (-1
  /// for this rank), owned by the caller and kept open longer than this.
  SocketTransport(int rank, std::vector<int> out, std::vector<int> in, Options o);

  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(peers_.size()); }
  Handle isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  Handle irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool test(Handle h) override;
  void wait_all(const Handle* hs, size_t n, Clock::time_point deadline) override;

  /// The rank whose connection broke (the last COMM error's), -1 if none.
  int failed_peer() const { return failed_peer_; }
  /// Payload bytes sent / received since the last call; resets both.
  void take_bytes(uint64_t* sent, uint64_t* received);

 private:
  struct Header {
    uint64_t tag;
    uint64_t len;
  };
  static_assert(sizeof(Header) == 16, "data frame header is 16 bytes");
  struct SendOp {
    Handle h;
    Header hdr;
    const char* data;
    size_t off = 0;  ///< over header + payload
  };
  struct RecvOp {
    Handle h;
    uint64_t tag;
    char* data;
    size_t len;
  };
  struct Unexpected {
    uint64_t tag;
    std::vector<char> data;
  };
  /// One peer's two connections and their queues.
  struct Peer {
    int out_fd = -1, in_fd = -1;
    std::string broken;  ///< why the connections failed; "" while they work
    std::deque<SendOp> sendq;
    std::deque<RecvOp> posted;
    std::deque<Unexpected> unexpected;
    // The incoming frame: header bytes so far, then its payload.
    Header hdr{};
    size_t hdr_got = 0;
    bool held = false;  ///< hdr is whole, matched nothing; payload not read
    bool in_payload = false;
    char* dst = nullptr;  ///< the matched buffer, or heap.data()
    size_t got = 0;
    Handle rx = 0;  ///< the matched receive (0: streaming into heap)
    std::vector<char> heap;
  };
  struct Op {
    int peer = -1;
    bool recv = false;
    bool done = false;
    dopt_status status = DOPT_OK;  ///< != OK: failed with `why`
    std::string why;
  };

  Handle add(int peer, bool recv);
  void complete(Handle h, dopt_status status = DOPT_OK, std::string why = {});
  /// One non-blocking pass over every peer; true if any byte moved.
  bool progress();
  /// Sender: write queued frames (several per sendmsg) until EAGAIN.
  bool write_frames(int p);
  /// Receiver: read frames from rank p until EAGAIN or nothing is wanted.
  bool read_frames(int p);
  /// The header bytes of the next frame; true once it is whole.
  bool read_header(Peer& P, int p, bool* moved);
  /// A whole header arrived: start its payload into the matched receive,
  /// or hold it.
  void on_header(Peer& P, int p);
  /// Payload of P.hdr goes to `dst` for receive h (h == 0: into the heap).
  void start_payload(Peer& P, Handle h, char* dst);
  /// Read held frames into the heap; true if there was one.
  bool buffer_held();
  /// Payload bytes into P.dst; true once the frame is whole.
  bool read_payload(Peer& P, int p, bool* moved);
  /// The frame is whole: complete its receive or keep it as unexpected.
  void on_frame(Peer& P, int p);
  /// Whether rank p's incoming stream is to be read now.
  bool wants_read(const Peer& P) const {
    return P.in_payload || P.hdr_got > 0 || (!P.held && !P.posted.empty());
  }
  /// Mark rank p's connections broken: every pending operation with it fails.
  void fail_peer(int p, const std::string& why);
  /// Block in poll() until a wanted fd is ready, the abort fd fires, or
  /// `deadline` (at most 500 ms).
  void wait_for_io(Clock::time_point deadline);
  /// Throw the first failure among hs, else ABORTED if destroyed or the
  /// abort grace ran out.
  void throw_if_failed(const Handle* hs, size_t n);
  /// Forget the handles; a pending one is withdrawn (see the file comment).
  void release(const Handle* hs, size_t n);
  /// A not-yet-complete handle's peer, to name in a timeout (receives first).
  int outstanding_peer(const Handle* hs, size_t n) const;

  int rank_;
  Options o_;
  std::vector<Peer> peers_;
  std::unordered_map<Handle, Op> ops_;
  Handle next_ = 0;
  int failed_peer_ = -1;
  Clock::time_point aborted_at_{};  ///< when the abort flag was first seen (epoch: not yet)
  Clock::time_point moved_at_{};    ///< when a wait last moved a byte
  uint64_t sent_ = 0, received_ = 0;
};

}  // namespace distopt::plugins::tcp
