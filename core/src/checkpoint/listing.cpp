// Which step directory a path names (a checkpoint directory's newest, or a
// step directory itself), every complete step of a directory, and one step by
// number. POSIX only (no std::filesystem: libtorch exports its own copy).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/atomic_file.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/reading.hpp"
#include "distopt/checkpoint_steps.hpp"
#include "distopt/error.hpp"

namespace distopt {
namespace checkpoint {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string strip_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

CheckpointInfo read_info(const std::string& where) {
  const std::string mpath = join(where, "manifest.json");
  auto text = read_file(mpath);
  return Manifest::from_json(std::string(text.begin(), text.end()), mpath).info(where);
}

}  // namespace

std::string step_directory(const std::string& path) {
  const std::string dir = strip_slashes(path);
  if (is_file(join(dir, "manifest.json"))) return dir;  // a step directory itself
  const std::string latest = join(dir, "latest");
  if (!is_file(latest)) return "";
  auto bytes = read_file(latest);
  std::string name(bytes.begin(), bytes.end());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw CheckpointError(latest + ": does not name a checkpoint ('" + name + "')");
  return join(dir, name);
}

}  // namespace checkpoint

std::vector<CheckpointInfo> list_checkpoints(const std::string& path) {
  using namespace checkpoint;
  const std::string dir = strip_slashes(path);
  if (is_file(join(dir, "manifest.json"))) return {read_info(dir)};
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw CheckpointError(dir + ": cannot open the checkpoint directory");
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("step-", 0) == 0 && is_file(join(join(dir, n), "manifest.json")))
      names.push_back(n);  // a save that crashed before its manifest is not a checkpoint
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());  // zero-padded steps: name order is age order
  std::vector<CheckpointInfo> out;
  for (const auto& n : names) out.push_back(read_info(join(dir, n)));
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
  const std::string latest = is_dir(dir) ? step_directory(dir) : "";
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
