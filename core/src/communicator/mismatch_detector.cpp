#include "communicator/mismatch_detector.hpp"

#include <chrono>
#include <sstream>
#include <thread>
#include <utility>

#include "distopt/store.hpp"

namespace distopt::comm_check {

MismatchDetector::MismatchDetector(std::shared_ptr<Store> store, std::string prefix, int rank,
                                   int world_size, std::string comm_name)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_size_(world_size),
      comm_name_(std::move(comm_name)) {}

std::string MismatchDetector::key(int rank) const {
  return prefix_ + "/rank/" + std::to_string(rank);
}

std::string MismatchDetector::read(const std::string& k) {
  try {
    if (!store_->check(k)) return "";
    auto v = store_->get(k, std::chrono::milliseconds(1000));
    return std::string(v.begin(), v.end());
  } catch (const std::exception&) {
    return "";
  }
}

void MismatchDetector::write(const std::string& k, const std::string& value) {
  try {
    store_->set(k, value);
  } catch (const std::exception&) {
  }
}

std::string MismatchDetector::message(const std::string& ranks_line) const {
  return "collective mismatch on communicator " + comm_name_ + ": " + ranks_line +
         ". Every rank must issue the same collectives in the same order: did the ranks run "
         "different numbers of steps (a rank whose data ran out calls join()), or take a "
         "rank-dependent branch?";
}

// Posts: "wait GEN SEQ KIND_SEQ SIGNATURE", "left ISSUED [LAST]", "failed
// ISSUED [LAST]" (left after a collective of its own failed), or "" (not
// waiting). The same position with another shape is a mismatch at once.
// `confirm` (stalls): another position, or a rank that left before issuing
// ours, counts once seen unchanged twice, and only while no rank is silent:
// a silent rank (computing, or cut off from the store by a network fault)
// can hold the others at different positions of matching collectives (a
// ring's sends complete into socket buffers, so a neighbour may be one
// collective ahead). Without `confirm` (a failed collective) only the
// departure counts, at once.
std::string MismatchDetector::compare(const Fingerprint& mine, bool confirm, bool* mismatch,
                                      int* silent) {
  std::ostringstream line;
  *mismatch = false;
  *silent = 0;
  bool moved = false;  // another position, confirmed: a mismatch unless a rank is silent
  for (int r = 0; r < world_size_; ++r) {
    if (r) line << "; ";
    line << "rank " << r << ": ";
    if (r == rank_) {
      line << mine.describe();
      continue;
    }
    const std::string post = read(key(r));
    std::istringstream in(post);
    std::string tag;
    in >> tag;
    bool differs = false;
    if (tag == "left" || tag == "failed") {
      uint64_t issued = 0;
      in >> issued;
      std::string rest;
      std::getline(in, rest);
      auto last = Fingerprint::decode(rest);
      line << (tag == "failed" ? "failed and left" : "left") << " the communicator after " << issued
           << " collective(s)";
      if (last) line << ", the last " << last->describe();
      // Its last collective was ours with another shape: the transport let
      // it complete (or fail) on its side, and ours can never complete.
      if (last && last->seq == mine.seq && last->signature() != mine.signature()) *mismatch = true;
      // A rank that left after a failure of its own stopped in the failure's
      // cascade (a cut link: a ring neighbour may already be one collective
      // ahead), not because it issued fewer collectives.
      differs = tag == "left" && issued < mine.seq;
    } else if (tag == "wait") {
      uint64_t gen = 0;
      in >> gen;
      std::string rest;
      std::getline(in, rest);
      auto fp = Fingerprint::decode(rest);
      if (!fp) {
        line << "unreadable post";
        continue;
      }
      line << fp->describe();
      if (fp->seq == mine.seq) {
        if (fp->signature() != mine.signature()) *mismatch = true;
        continue;
      }
      differs = true;
    } else {
      line << "not waiting in a collective";
      ++*silent;
    }
    // Without a stall to confirm it, another position proves nothing (ranks
    // failing in a cascade stop at different collectives); a clean departure
    // does.
    if (!differs || (!confirm && tag != "left")) continue;
    if (!confirm) {
      *mismatch = true;
      continue;
    }
    // Another position (or a departure): a peer's post may trail its
    // progress by a moment, so it counts once seen unchanged twice.
    auto it = seen_.find(r);
    if (it != seen_.end() && it->second.post == post && it->second.my_seq == mine.seq)
      moved = true;
    else
      seen_[r] = {post, mine.seq};
  }
  if (moved && *silent == 0) *mismatch = true;
  return line.str();
}

// A peer may have published its account while we read the posts (and then
// left, so its post now reads "left"): every rank reports the first one.
std::string MismatchDetector::publish(const std::string& msg) {
  const std::string first = read(prefix_ + "/mismatch");
  if (!first.empty()) return first;
  write(prefix_ + "/mismatch", msg);
  return msg;
}

std::string MismatchDetector::on_stall(const Fingerprint& mine) {
  std::lock_guard<std::mutex> lk(mu_);
  write(key(rank_), "wait " + std::to_string(++gen_) + " " + mine.encode());
  posted_ = true;
  const std::string reported = read(prefix_ + "/mismatch");
  if (!reported.empty()) return reported;
  bool mismatch = false;
  int silent = 0;
  const std::string line = compare(mine, /*confirm=*/true, &mismatch, &silent);
  if (!mismatch) return "";
  return publish(message(line));
}

void MismatchDetector::on_wait_done() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!posted_) return;
  write(key(rank_), "");
  posted_ = false;
}

std::string MismatchDetector::explain_failure(const Fingerprint& mine,
                                              std::chrono::milliseconds patience) {
  std::lock_guard<std::mutex> lk(mu_);
  failed_ = true;
  // Published first, so peers whose collective failed too can name ours.
  write(key(rank_), "wait " + std::to_string(++gen_) + " " + mine.encode());
  posted_ = true;
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    const std::string reported = read(prefix_ + "/mismatch");
    if (!reported.empty()) return reported;
    bool mismatch = false;
    int silent = 0;
    const std::string line = compare(mine, /*confirm=*/false, &mismatch, &silent);
    const bool late = std::chrono::steady_clock::now() >= deadline;
    // A mismatch with a rank not posted yet: wait for its post (within the
    // patience), so that the account names what every rank was doing.
    if (mismatch && (silent == 0 || late)) return publish(message(line));
    if (!mismatch && (silent == 0 || late)) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void MismatchDetector::on_leave(uint64_t issued, const Fingerprint& last) {
  std::lock_guard<std::mutex> lk(mu_);
  write(key(rank_), std::string(failed_ ? "failed " : "left ") + std::to_string(issued) +
                        (last.seq ? " " + last.encode() : ""));
}

}  // namespace distopt::comm_check
