// Names a collective mismatch through the rendezvous store. Ranks publish
// what they wait on only when a wait stalls (nothing on the fast path), so a
// job whose collectives match pays nothing; ranks that issued different
// collectives fail within a few stall intervals instead of at the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "communicator/fingerprint.hpp"

namespace distopt {
class Store;
}

namespace distopt::comm_check {

/// One communicator's detector on one rank. Store keys live under `prefix`
/// (identical on every rank of the communicator). Thread-safe. Store errors
/// (e.g. rank 0, which hosts the store, already gone) are swallowed: the
/// detector then knows nothing and the communicator's own error stands.
class MismatchDetector {
 public:
  MismatchDetector(std::shared_ptr<Store> store, std::string prefix, int rank, int world_size,
                   std::string comm_name);

  /// A wait on `mine` has not completed for one interval: publish it and
  /// compare with what the other ranks published. Returns the message naming
  /// every rank's collective when they disagree ("" while they may agree):
  /// the same position with another kind, size, dtype, root or reduction
  /// fails at once; different positions, or a rank that left after fewer
  /// collectives, once seen twice (a peer's post may be a moment stale).
  std::string on_stall(const Fingerprint& mine);
  /// The stalled wait completed: withdraw this rank's post.
  void on_wait_done();
  /// Message for a failed collective `mine` (a transport may fail fast on a
  /// mismatch, before any wait stalls): publishes `mine`, then for up to
  /// `patience` reads the other ranks' posts until none is silent, and
  /// returns a mismatch some rank reported or the one the posts show (a peer
  /// at another position or shape, or one that left before issuing it);
  /// "" if none shows. Blocks at most `patience` plus store round trips.
  std::string explain_failure(const Fingerprint& mine, std::chrono::milliseconds patience);
  /// This rank destroys the communicator after issuing `issued` collectives,
  /// the last one `last` (a default Fingerprint when none). Peers read a
  /// departure before their collective as a mismatch (fewer collectives
  /// issued) unless one of this rank's collectives failed first
  /// (explain_failure ran): then it is posted as "failed".
  void on_leave(uint64_t issued, const Fingerprint& last);

 private:
  std::string key(int rank) const;
  std::string read(const std::string& key);
  void write(const std::string& key, const std::string& value);
  /// "rank r: <what it waits on>" for every rank, and whether they disagree.
  std::string compare(const Fingerprint& mine, bool confirm, bool* mismatch, int* silent);
  std::string message(const std::string& ranks_line) const;
  /// Publish `msg` as the communicator's mismatch account unless a peer
  /// published one first; returns the account that stands.
  std::string publish(const std::string& msg);

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_, world_size_;
  std::string comm_name_;
  std::mutex mu_;
  uint64_t gen_ = 0;  // posts by this rank, so peers can tell a fresh post from an old one
  bool posted_ = false;
  bool failed_ = false;  // a collective of this rank failed: its departure proves nothing
  struct Seen {
    std::string post;  // the peer's post when first seen disagreeing
    uint64_t my_seq = 0;
  };
  std::map<int, Seen> seen_;
};

}  // namespace distopt::comm_check
