// Collectives over shared memory, used when every rank of a communicator is
// on one host (as NCCL's SHM transport): each rank copies its input into its
// own segment once, reduces its 1/W slice reading the peers' segments
// directly, and copies the result out. No kernel copies, no socket wakeups.
//
// Tensors stream through in rounds of one slot (half a segment; the two slots
// alternate, so a rank fills round k+1 while peers still read round k). The
// round number is global to the communicator (every rank runs the same ops
// in the same order on its progress thread), and each rank publishes three
// counters per round in its header (see ShmHeader):
//   ready   its input is in its slot;
//   reduced its slice of the slot holds the final values (allreduce only);
//   done    it has finished reading every peer's slot of that round.
// A rank overwrites its slot for round k only after every peer is done with
// round k-2, the previous use of that slot.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ring.hpp"
#include "shm_segment.hpp"

namespace distopt::plugins::tcp {

struct ShmSetup {
  bool enabled = true;  ///< false: take part in the agreement, but vote for TCP
  int rank = 0;
  int world_size = 1;
  dopt_store* store = nullptr;
  std::string scope;         ///< store key prefix, identical on every rank
  size_t segment_bytes = 0;  ///< per rank: header page + two slots
  double timeout_s = 60;     ///< for the store handshake
};

class ShmTransport {
 public:
  /// Collective, through the store: every rank publishes its host id; if all
  /// match, each creates its segment, maps every peer's, and says whether all
  /// of that worked; then the names are unlinked. Returns nullptr on every
  /// rank alike (the TCP ring is used) unless ALL ranks mapped all segments.
  /// Throws std::runtime_error if the store handshake itself fails.
  static std::unique_ptr<ShmTransport> create(const ShmSetup& s);

  size_t slot_bytes() const { return slot_bytes_; }

  // Each runs on the progress thread to completion, failure or the deadline.
  // Arguments were validated by the caller; counts are elements of `dt`.
  RingResult allreduce(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                       const ShmWaitCtx& ctx);
  /// send holds world_size blocks of `count` elements; recv gets this rank's block, reduced.
  RingResult reduce_scatter(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                            const ShmWaitCtx& ctx);
  /// recv gets every rank's `bytes` of send, in rank order.
  RingResult allgather(const char* send, char* recv, size_t bytes, const ShmWaitCtx& ctx);
  RingResult broadcast(char* buf, size_t bytes, int root, const ShmWaitCtx& ctx);

 private:
  ShmTransport(int rank, int world, size_t segment_bytes, std::vector<ShmSegment> segs);
  char* slot(int peer, uint64_t round) const {
    return segs_[peer].slot(static_cast<int>(round & 1), slot_bytes_);
  }
  ShmHeader* hdr(int peer) const { return segs_[peer].header(); }
  /// Wait for peer's `counter` to reach value; on failure fills res and returns false.
  bool wait(int peer, std::atomic<uint64_t> ShmHeader::*counter, uint64_t value,
            const ShmWaitCtx& ctx, RingResult* res) const;
  /// Before writing this rank's slot for round `r`: every peer is done with round r-2.
  bool wait_slot_free(uint64_t r, const ShmWaitCtx& ctx, RingResult* res) const;
  void publish(std::atomic<uint64_t> ShmHeader::*counter, uint64_t value) const;
  /// publish(ready, r), and count `bytes` as handed to peers (sdk/fault_point.hpp).
  void publish_ready(uint64_t r, size_t bytes, const ShmWaitCtx& ctx) const;

  int rank_, world_;
  size_t slot_bytes_;
  uint64_t round_ = 0;            ///< last round started; progress thread only
  std::vector<ShmSegment> segs_;  ///< segs_[p]: rank p's segment (own included)
};

}  // namespace distopt::plugins::tcp
