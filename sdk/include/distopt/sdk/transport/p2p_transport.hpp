// The point-to-point layer under distopt's collective algorithms
// (p2p_collectives.hpp): a transport moves tagged byte messages between
// ranks, nothing more. The split follows Gloo (algorithms over an abstract
// `transport::Pair`) and UCC (algorithms over UCP tag send/recv), so a
// communicator only writes a Transport and reuses the tested algorithms.
// Header-only, torch-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk::p2p {

using Clock = std::chrono::steady_clock;

/// An outstanding isend/irecv; transport-defined, never 0.
using Handle = uint64_t;

/// Tags (UCC's layout in spirit). A transport promises kTagBits bits of tag;
/// the top one separates the user's send/recv from collectives, which use
/// (collective sequence number, step): every collective a communicator
/// issues takes the next sequence number (mod 2^20) and numbers its messages
/// by step (< 2^19), so the messages of consecutive or overlapping
/// collectives never match each other even if one rank runs ahead.
struct Tag {
  static constexpr int kTagBits = 40;   ///< bits a transport must carry
  static constexpr int kStepBits = 19;  ///< steps per collective: < 524288
  static constexpr int kSeqBits = 20;   ///< sequence numbers wrap at 2^20
  static constexpr uint64_t kUserBit = uint64_t{1} << (kTagBits - 1);

  /// The tag of step `step` of the collective numbered `seq`.
  static constexpr uint64_t collective(uint64_t seq, uint64_t step) {
    return ((seq & ((uint64_t{1} << kSeqBits) - 1)) << kStepBits) |
           (step & ((uint64_t{1} << kStepBits) - 1));
  }
  /// The tag of a user send/recv with tag `user` (an int32 >= 0).
  static constexpr uint64_t user(uint32_t user) { return kUserBit | user; }
};

/// One rank's end of a set of reliable, ordered-by-posting, tagged
/// point-to-point channels to every other rank of a communicator.
///
/// Matching: an irecv(peer, tag) takes the first message isent by `peer`
/// with `tag` to this rank that no earlier irecv(peer, tag) took (posting
/// order on both sides). Sizes must match exactly; a mismatch is a
/// DOPT_ERR_INTERNAL failure of the receive.
///
/// Thread safety: none. All calls come from one thread (the communicator's
/// progress thread); buffers must stay valid until the handle completes.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  /// Start sending `bytes` bytes at `data` to `peer` (!= rank()) with
  /// `tag` (< 2^Tag::kTagBits). Never blocks on the peer.
  virtual Handle isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  /// Start receiving exactly `bytes` bytes from `peer` with `tag` into `data`.
  virtual Handle irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
  /// Progress; true when `h` has completed (the handle is then released and
  /// must not be used again). Throws sdk::Error as wait_all does.
  virtual bool test(Handle h) = 0;
  /// Progress until every handle completed, then release them all (also
  /// when it throws). Throws sdk::Error:
  ///   DOPT_ERR_COMM     a peer's connection failed; the message names it
  ///                     ("rank 2: connection lost (...)");
  ///   DOPT_ERR_TIMEOUT  `deadline` passed; names a peer still outstanding;
  ///   DOPT_ERR_ABORTED  the transport is being destroyed.
  virtual void wait_all(const Handle* hs, size_t n, Clock::time_point deadline) = 0;
};

}  // namespace distopt::sdk::p2p
