// Which step directory a path names (a checkpoint directory's newest, or a
// step directory itself), every complete step of a directory, and one step by
// number. POSIX only (no std::filesystem: libtorch exports its own copy).
#include <algorithm>
#include <string>
#include <vector>

#include "base/posix_fs.hpp"
#include "distopt/checkpoint_steps.hpp"
#include "distopt/error.hpp"
#include "state/atomic_file.hpp"
#include "state/manifest.hpp"
#include "state/reading.hpp"

namespace pfs = distopt::util;

namespace distopt {
namespace checkpoint {
namespace {

std::string strip_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool has_manifest(const std::string& dir) {
  return pfs::is_regular_file(pfs::join(dir, "manifest.json"));
}

CheckpointInfo read_info(const std::string& where) {
  const std::string mpath = pfs::join(where, "manifest.json");
  auto text = read_file(mpath);
  return Manifest::from_json(std::string(text.begin(), text.end()), mpath).info(where);
}

}  // namespace

std::string latest_name(const std::string& dir) {
  const std::string p = pfs::join(dir, "latest");
  if (!pfs::exists(p)) return "";
  auto bytes = read_file(p);
  std::string name(bytes.begin(), bytes.end());
  const size_t b = name.find_first_not_of(" \t\r\n"), e = name.find_last_not_of(" \t\r\n");
  name = b == std::string::npos ? "" : name.substr(b, e - b + 1);
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw CheckpointError(p + ": does not name a checkpoint ('" + name + "')");
  return name;
}

std::string step_directory(const std::string& path) {
  const std::string dir = strip_slashes(path);
  if (has_manifest(dir)) return dir;  // a step directory itself
  if (!pfs::is_regular_file(pfs::join(dir, "latest"))) return "";
  return pfs::join(dir, latest_name(dir));
}

}  // namespace checkpoint

std::vector<CheckpointInfo> list_checkpoints(const std::string& path) {
  using namespace checkpoint;
  const std::string dir = strip_slashes(path);
  if (has_manifest(dir)) return {read_info(dir)};
  std::vector<std::string> names;
  try {
    for (const std::string& n : pfs::list_dir(dir))
      if (n.rfind("step-", 0) == 0 && has_manifest(pfs::join(dir, n)))
        names.push_back(n);  // a save that crashed before its manifest is not a checkpoint
  } catch (const std::exception&) {
    throw CheckpointError(dir + ": cannot open the checkpoint directory");
  }
  std::sort(names.begin(), names.end());  // zero-padded steps: name order is age order
  std::vector<CheckpointInfo> out;
  for (const auto& n : names) out.push_back(read_info(pfs::join(dir, n)));
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step < b.step;
  });
  return out;
}

std::string checkpoint_step_path(const std::string& dir, int64_t step) {
  using namespace checkpoint;
  const std::vector<CheckpointInfo> all = list_checkpoints(dir);
  // Several saves of one step (a resume that saved at once): the one `latest`
  // names, else the newest.
  std::string found;
  const std::string latest = pfs::is_directory(dir) ? step_directory(dir) : "";
  for (const auto& c : all)
    if (c.step == step && (found.empty() || found != latest)) found = c.path;
  if (found.empty()) {
    std::string steps;
    for (const auto& c : all) steps += (steps.empty() ? "" : ", ") + std::to_string(c.step);
    throw CheckpointError(strip_slashes(dir) + ": no checkpoint of step " + std::to_string(step) +
                          (steps.empty() ? " (it holds none)" : " (steps there: " + steps + ")"));
  }
  return found;
}

}  // namespace distopt
