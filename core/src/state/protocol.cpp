// The directory protocol (protocol.hpp, distopt/checkpoint.hpp) and
// find_checkpoint. Commit order: every rank's shard (atomic rename each) ->
// agreement over the communicator -> rank 0's manifest -> rank 0's `latest`
// -> agreement again. Loading never writes.
#include "state/protocol.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "base/posix_fs.hpp"
#include "base/services.hpp"
#include "distopt/error.hpp"
#include "state/atomic_file.hpp"
#include "state/exchange.hpp"
#include "state/manifest.hpp"
#include "state/reading.hpp"
#include "state/state_source.hpp"

namespace pfs = distopt::util;

namespace distopt {

namespace checkpoint {
namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kManifest = "manifest.json";

std::string step_dir_name(int64_t step, int64_t suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%09lld", static_cast<long long>(step));
  return suffix == 0 ? std::string(buf) : std::string(buf) + "-" + std::to_string(suffix);
}

// Test-only: DISTOPT_FAULT_INJECT=save:RANK[:N] kills rank RANK halfway
// through writing its shard of its N-th save (default 1) in this process.
bool die_in_this_save(int rank) {
  static std::atomic<int> saves{0};
  const int n = ++saves;
  const char* v = std::getenv("DISTOPT_FAULT_INJECT");
  if (!v || std::string(v).rfind("save:", 0) != 0) return false;
  int r = -1, k = 1;
  if (std::sscanf(v + 5, "%d:%d", &r, &k) < 1) return false;
  return r == rank && k == n;
}

std::vector<int64_t> gather_i64(const Group& g, const std::vector<int64_t>& mine) {
  return state::gather_i64(g.comm, g.rank, g.world_size, mine);
}

void remove_old(const std::string& dir, const std::string& latest, int keep) {
  std::vector<std::string> names;
  for (const std::string& n : pfs::list_dir(dir))
    if (n.rfind("step-", 0) == 0 && pfs::is_directory(pfs::join(dir, n))) names.push_back(n);
  std::sort(names.begin(), names.end());  // zero-padded steps: name order is age order
  // Besides `latest`, only lower steps are kept: one at `latest`'s step or
  // above is stale (a crashed save, or the abandoned future of a run resumed
  // from an earlier step: --resume-from replaces the newer ones).
  auto step_of = [](const std::string& n) { return std::strtoll(n.c_str() + 5, nullptr, 10); };
  const long long latest_step = step_of(latest);
  int older_kept = 0;
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    if (*it == latest) continue;
    if (step_of(*it) < latest_step && older_kept < keep - 1) {
      ++older_kept;
      continue;
    }
    const std::string err = pfs::remove_all(pfs::join(dir, *it));
    if (!err.empty())
      log(DOPT_LOG_WARN, "checkpoint",
          "could not remove old checkpoint " + pfs::join(dir, *it) + ": " + err);
  }
}

}  // namespace

Loaded read_newest(const std::string& dir) {
  Loaded l;
  l.where = step_directory(dir);  // listing.cpp: DIR/<latest>, or DIR itself
  if (l.where.empty())
    throw CheckpointError(dir + ": no checkpoint (no '" + std::string(kLatest) + "' file)");
  const std::string mpath = pfs::join(l.where, kManifest);
  auto text = read_file(mpath);
  l.manifest = Manifest::from_json(std::string(text.begin(), text.end()), mpath);
  for (const ShardRecord& s : l.manifest.shards) {
    const std::string path = pfs::join(l.where, s.file);
    auto bytes = read_file(path);
    if (bytes.size() != s.bytes)
      throw CheckpointError(path + ": " + std::to_string(bytes.size()) +
                            " bytes, the manifest says " + std::to_string(s.bytes) +
                            " (truncated or replaced)");
    if (crc32_of(bytes) != s.crc32)
      throw CheckpointError(path + ": CRC-32 mismatch (the file is corrupt)");
    l.shards.push_back(state::ShardState::decode(bytes, path, s.rank, l.manifest.world_size));
  }
  return l;
}

namespace {

ShardRecord write_shard(const std::string& step_dir, const state::ShardState& s, int rank,
                        int world) {
  ShardRecord r;
  r.rank = rank;
  r.file = shard_file_name(rank, world);
  auto bytes = s.encode(rank, world);
  r.bytes = bytes.size();
  r.crc32 = crc32_of(bytes);
  write_atomic(pfs::join(step_dir, r.file), bytes, die_in_this_save(rank));
  return r;
}

}  // namespace
}  // namespace checkpoint

std::optional<CheckpointInfo> find_checkpoint(const std::string& dir) {
  using namespace checkpoint;
  const std::string where = step_directory(dir);  // listing.cpp: DIR/<latest>, or DIR itself
  if (where.empty()) return std::nullopt;
  const std::string mpath = pfs::join(where, kManifest);
  auto text = read_file(mpath);
  return Manifest::from_json(std::string(text.begin(), text.end()), mpath).info(where);
}

namespace checkpoint {

CheckpointInfo save(const std::string& dir, Participant& p, const CheckpointExtra& extra, int keep,
                    const Group& g) {
  if (keep < 1) throw ConfigError("save_checkpoint: keep must be at least 1");
  const int rank = g.rank, world = g.world_size;
  Manifest man = p.describe(world);
  man.extra = extra;

  // Rank 0 picks a fresh step directory (never the one `latest` names) and
  // removes a stale one left by a crashed save.
  int64_t suffix = 0;
  std::string err;
  if (rank == 0) {
    try {
      pfs::create_directories(dir);
      const std::string latest = latest_name(dir);
      while (step_dir_name(man.step, suffix) == latest ||
             (suffix > 0 && pfs::exists(pfs::join(dir, step_dir_name(man.step, suffix)))))
        ++suffix;
      const std::string target = pfs::join(dir, step_dir_name(man.step, suffix));
      const std::string stale = pfs::remove_all(target);
      if (!stale.empty()) throw CheckpointError("cannot remove a stale checkpoint: " + stale);
      pfs::create_directories(target);
    } catch (const std::exception& e) {
      err = e.what();
      suffix = -1;
    }
  }
  suffix = gather_i64(g, {rank == 0 ? suffix : 0})[0];
  if (suffix < 0)
    throw CheckpointError(rank == 0 ? err
                                    : dir + ": rank 0 could not prepare the checkpoint directory");
  const std::string name = step_dir_name(man.step, suffix);
  const std::string step_dir = pfs::join(dir, name);

  // Every rank: its shard.
  ShardRecord mine;
  bool ok = true;
  std::exception_ptr failure;
  try {
    state::ShardState s = p.snapshot(rank);
    mine = write_shard(step_dir, s, rank, world);
  } catch (const std::exception&) {
    ok = false;
    failure = std::current_exception();
  }
  auto all = gather_i64(
      g, {ok ? 1 : 0, static_cast<int64_t>(mine.bytes), static_cast<int64_t>(mine.crc32)});
  if (!ok) std::rethrow_exception(failure);
  for (int r = 0; r < world; ++r)
    if (all[3 * r] != 1)
      throw CheckpointError(dir + ": rank " + std::to_string(r) +
                            " could not write its shard; the previous checkpoint stays the newest");

  // Rank 0: manifest, then `latest` (the commit point), then old ones go.
  int64_t committed = 1;
  if (rank == 0) {
    try {
      for (int r = 0; r < world; ++r)
        man.shards.push_back({r, shard_file_name(r, world), static_cast<uint64_t>(all[3 * r + 1]),
                              static_cast<uint32_t>(all[3 * r + 2])});
      const std::string text = man.to_json();
      write_atomic(pfs::join(step_dir, kManifest), std::vector<char>(text.begin(), text.end()));
      const std::string latest = name + "\n";
      write_atomic(pfs::join(dir, kLatest), std::vector<char>(latest.begin(), latest.end()));
      remove_old(dir, name, keep);
    } catch (const std::exception& e) {
      committed = 0;
      err = e.what();
    }
  }
  committed = gather_i64(g, {rank == 0 ? committed : 0})[0];
  if (!committed)
    throw CheckpointError(rank == 0 ? err
                                    : dir +
                                          ": rank 0 could not commit the checkpoint; the "
                                          "previous one stays the newest");
  log(DOPT_LOG_DEBUG, "checkpoint", "saved " + step_dir);
  return man.info(step_dir);
}

CheckpointInfo load(const std::string& dir, Participant& p, const Group& g) {
  std::exception_ptr failure;
  std::optional<Loaded> l;
  try {
    l = read_newest(dir);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  // Every rank fails together: a rank that went on alone would hang in its
  // first collective.
  auto read = gather_i64(g, {l ? 0 : 1, l ? l->manifest.schedule_phase : -1});
  if (!l) std::rethrow_exception(failure);
  for (int r = 0; r < g.world_size; ++r)
    if (read[2 * r])
      throw CheckpointError(dir + ": rank " + std::to_string(r) + " could not load the checkpoint");
  p.resume(l->manifest, l->where);

  std::optional<CheckpointInfo> info;
  try {
    if (l->manifest.world_size != g.world_size)
      log(g.rank == 0 ? DOPT_LOG_INFO : DOPT_LOG_DEBUG, "checkpoint",
          l->where + ": saved by " + std::to_string(l->manifest.world_size) +
              " ranks, loading into " + std::to_string(g.world_size) + " (resharding)");
    state::StateSource src(std::move(l->shards), g.rank, g.world_size);
    p.check_compatible(src, l->manifest, l->where);
    p.restore(src, l->manifest);
    info = l->manifest.info(l->where);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  auto flags = gather_i64(g, {info ? 0 : 1});
  if (!info) std::rethrow_exception(failure);
  for (int r = 0; r < g.world_size; ++r)
    if (flags[r])
      throw CheckpointError(dir + ": rank " + std::to_string(r) + " could not load the checkpoint");
  return *info;
}

}  // namespace checkpoint
}  // namespace distopt
