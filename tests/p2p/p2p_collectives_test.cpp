// sdk::p2p::Collectives over an in-memory transport (one thread per rank,
// world 1-4): every operation, dtype, reduce op and awkward count against a
// plain single-process reference. The data are small integers (times the
// world size, so averages are exact too): every dtype must match exactly.
#include "distopt/sdk/collective/p2p_collectives.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

using namespace distopt::sdk;
using namespace distopt::sdk::p2p;

namespace {

/// Mailboxes shared by the ranks of one in-memory "network".
struct Network {
  explicit Network(int n) : world(n) {}
  struct Recv {
    void* data;
    size_t bytes;
    bool done = false;
    std::string error;
  };
  using Key = std::tuple<int, int, uint64_t>;  // (src, dst, tag)
  int world;
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, std::deque<std::vector<char>>> messages;
  std::map<Key, std::deque<std::shared_ptr<Recv>>> posted;

  // Pair posted receives with queued messages, both in posting order. Locked.
  void match(const Key& k) {
    auto& m = messages[k];
    auto& p = posted[k];
    while (!m.empty() && !p.empty()) {
      auto r = p.front();
      if (m.front().size() != r->bytes)
        r->error = "size mismatch";
      else
        std::memcpy(r->data, m.front().data(), r->bytes);
      r->done = true;
      m.pop_front();
      p.pop_front();
    }
  }
};

/// One rank's transport: sends are eager copies, receives complete when matched.
class MemTransport final : public Transport {
 public:
  MemTransport(Network& net, int rank) : net_(net), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return net_.world; }
  Handle isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    REQUIRE(peer != rank_);
    REQUIRE(tag < (uint64_t{1} << Tag::kTagBits));
    std::lock_guard<std::mutex> lk(net_.mu);
    Network::Key k{rank_, peer, tag};
    auto* p = static_cast<const char*>(data);
    net_.messages[k].emplace_back(p, p + bytes);
    net_.match(k);
    net_.cv.notify_all();
    return add(nullptr, peer);
  }
  Handle irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    std::lock_guard<std::mutex> lk(net_.mu);
    Network::Key k{peer, rank_, tag};
    auto r = std::make_shared<Network::Recv>(Network::Recv{data, bytes, false, {}});
    net_.posted[k].push_back(r);
    net_.match(k);
    return add(r, peer);
  }
  bool test(Handle h) override {
    std::lock_guard<std::mutex> lk(net_.mu);
    auto& o = ops_.at(h);
    if (o.recv && !o.recv->done) return false;
    ops_.erase(h);
    return true;
  }
  void wait_all(const Handle* hs, size_t n, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lk(net_.mu);
    for (size_t i = 0; i < n; ++i) {
      auto o = ops_.at(hs[i]);
      ops_.erase(hs[i]);
      if (!o.recv) continue;
      if (!net_.cv.wait_until(lk, deadline, [&] { return o.recv->done; }))
        throw Error(DOPT_ERR_TIMEOUT, "rank " + std::to_string(o.peer) + ": timed out");
      if (!o.recv->error.empty()) throw Error(DOPT_ERR_INTERNAL, o.recv->error);
    }
  }

 private:
  struct Op {
    std::shared_ptr<Network::Recv> recv;  // null: a send (complete at once)
    int peer;
  };
  Handle add(std::shared_ptr<Network::Recv> r, int peer) {
    ops_[++next_] = Op{std::move(r), peer};
    return next_;
  }
  Network& net_;
  int rank_;
  Handle next_ = 0;
  std::map<Handle, Op> ops_;
};

/// Run body(collectives, rank) on `world` threads over one network.
void run_ranks(int world, CollectiveOptions o, const std::function<void(Collectives&, int)>& body) {
  Network net(world);
  std::vector<std::thread> th;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      try {
        MemTransport t(net, r);
        Collectives c(t, o);
        body(c, r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < world; ++r)
    CHECK_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
}

Clock::time_point soon() { return Clock::now() + std::chrono::seconds(30); }

// Encode / decode a small integer in each dtype (exact in all of them).
void put(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::F64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    default: {
      // bfloat16 / float16 of a small integer (|v| < 2048): exact bit patterns.
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h;
      if (t == DType::BF16) {
        h = static_cast<uint16_t>(u >> 16);
      } else {
        const uint32_t sign = (u >> 16) & 0x8000u;
        const uint32_t exp = ((u >> 23) & 0xffu) - 127 + 15;
        h = f == 0 ? static_cast<uint16_t>(sign)
                   : static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3ffu));
      }
      static_cast<uint16_t*>(p)[i] = h;
    }
  }
}
double get(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F64:
      return static_cast<const double*>(p)[i];
    case DType::I32:
      return static_cast<const int32_t*>(p)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    default: {
      float out[1];
      uint16_t h = static_cast<const uint16_t*>(p)[i];
      uint32_t u;
      if (t == DType::BF16) {
        u = uint32_t(h) << 16;
      } else {
        const uint32_t sign = (h & 0x8000u) << 16;
        const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
        u = (e == 0 && m == 0) ? sign : sign | ((e - 15 + 127) << 23) | (m << 13);
      }
      std::memcpy(out, &u, 4);
      return out[0];
    }
  }
}

// Rank r's element i: n * (small integer in [-5, 5]).
double value(int n, int r, size_t i) {
  return n * static_cast<double>((i * 7 + r * 3) % 11) - 5 * n;
}

double reference(int n, size_t i, dopt_reduce_op op) {
  double acc = value(n, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(n, r, i);
    if (op == DOPT_REDUCE_MIN)
      acc = std::min(acc, v);
    else if (op == DOPT_REDUCE_MAX)
      acc = std::max(acc, v);
    else
      acc += v;
  }
  return op == DOPT_REDUCE_AVG ? acc / n : acc;
}

const DType kTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64};
const dopt_reduce_op kOps[] = {DOPT_REDUCE_SUM, DOPT_REDUCE_AVG, DOPT_REDUCE_MIN, DOPT_REDUCE_MAX};
// 0, 1, 7, not divisible by 2-4, and sizes crossing the small/ring threshold
// and the segment size (set small below so the pipeline has many segments).
const size_t kCounts[] = {0, 1, 7, 1001, 40000};

CollectiveOptions small_opts() {
  CollectiveOptions o;
  o.small_bytes = 512;
  o.segment_bytes = 4096;
  return o;
}

}  // namespace

TEST_CASE("p2p allreduce: every dtype, op, count, world 1-4 (both algorithms)") {
  for (int n = 1; n <= 4; ++n)
    for (DType t : kTypes)
      for (dopt_reduce_op op : kOps)
        for (size_t count : kCounts) {
          CAPTURE(n);
          CAPTURE(dtype_name(t));
          CAPTURE(static_cast<int>(op));
          CAPTURE(count);
          std::vector<int> bad(n, 0);
          run_ranks(n, small_opts(), [&](Collectives& c, int r) {
            const size_t esz = dtype_size(t);
            std::vector<char> in(count * esz + 1), out(count * esz + 1);
            for (size_t i = 0; i < count; ++i) put(t, in.data(), i, value(n, r, i));
            c.allreduce(in.data(), out.data(), count, t, op, soon());
            // And in place.
            c.allreduce(in.data(), in.data(), count, t, op, soon());
            for (size_t i = 0; i < count; ++i)
              if (get(t, out.data(), i) != reference(n, i, op) ||
                  get(t, in.data(), i) != reference(n, i, op))
                ++bad[r];
          });
          for (int r = 0; r < n; ++r) CHECK(bad[r] == 0);
        }
}

TEST_CASE("p2p reduce_scatter and allgather: every dtype, op, count, world 1-4") {
  for (int n = 1; n <= 4; ++n)
    for (DType t : kTypes)
      for (dopt_reduce_op op : kOps)
        for (size_t count : kCounts) {
          CAPTURE(n);
          CAPTURE(dtype_name(t));
          CAPTURE(static_cast<int>(op));
          CAPTURE(count);
          std::vector<int> bad(n, 0);
          run_ranks(n, small_opts(), [&](Collectives& c, int r) {
            const size_t esz = dtype_size(t);
            std::vector<char> in(count * n * esz + 1), out(count * esz + 1);
            for (size_t i = 0; i < count * n; ++i) put(t, in.data(), i, value(n, r, i));
            c.reduce_scatter(in.data(), out.data(), count, t, op, soon());
            for (size_t i = 0; i < count; ++i)
              if (get(t, out.data(), i) != reference(n, r * count + i, op)) ++bad[r];
            // allgather the shards back: the whole reduced vector everywhere.
            std::vector<char> all(count * n * esz + 1);
            c.allgather(out.data(), all.data(), count * esz, soon());
            for (size_t i = 0; i < count * n; ++i)
              if (get(t, all.data(), i) != reference(n, i, op)) ++bad[r];
          });
          for (int r = 0; r < n; ++r) CHECK(bad[r] == 0);
        }
}

TEST_CASE("p2p broadcast from every root (direct and chain) and barrier") {
  for (int n = 1; n <= 4; ++n)
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{300}, size_t{50001}})
      for (int root = 0; root < n; ++root) {
        CAPTURE(n);
        CAPTURE(bytes);
        CAPTURE(root);
        std::vector<int> bad(n, 0);
        run_ranks(n, small_opts(), [&](Collectives& c, int r) {
          std::vector<char> b(bytes + 1, 0);
          if (r == root)
            for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<char>(i * 31 + root);
          c.broadcast(b.data(), bytes, root, soon());
          for (size_t i = 0; i < bytes; ++i)
            if (b[i] != static_cast<char>(i * 31 + root)) ++bad[r];
          c.barrier(soon());
        });
        for (int r = 0; r < n; ++r) CHECK(bad[r] == 0);
      }
}

TEST_CASE("p2p collectives: a rank that never comes makes the others time out, naming it") {
  Network net(3);
  std::vector<std::string> errors(2);
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      MemTransport t(net, r);
      Collectives c(t);
      std::vector<float> v(10, 1.0f);
      try {
        c.allreduce(v.data(), v.data(), v.size(), DType::F32, DOPT_REDUCE_SUM,
                    Clock::now() + std::chrono::milliseconds(200));
      } catch (const Error& e) {
        errors[r] = std::to_string(e.status()) + " " + e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(errors[r]);
    CHECK(errors[r].find(std::to_string(DOPT_ERR_TIMEOUT)) == 0);
    CHECK(errors[r].find("rank 2") != std::string::npos);
  }
}

TEST_CASE("p2p tags: collective and user tags never collide and fit the transport") {
  CHECK(Tag::collective(0, 0) != Tag::user(0));
  CHECK(Tag::collective(1, 0) != Tag::collective(0, 1));
  CHECK(Tag::collective((uint64_t{1} << Tag::kSeqBits) - 1, (uint64_t{1} << Tag::kStepBits) - 1) <
        Tag::kUserBit);
  CHECK(Tag::user(0xffffffffu) < (uint64_t{1} << Tag::kTagBits));
}
