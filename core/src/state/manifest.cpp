#include "state/manifest.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "distopt/error.hpp"

namespace distopt::checkpoint {

namespace {

constexpr const char* kManifestFormat = "distopt-checkpoint-1";
using nlohmann::json;

json to_json(const ComponentRecord& c) {
  return {{"plugin", c.plugin},
          {"component", c.component},
          {"version", c.version},
          {"plugin_version", c.plugin_version},
          {"abi", std::to_string(c.abi_major) + "." + std::to_string(c.abi_minor)},
          {"options", c.options}};
}

ComponentRecord component_from(const json& j) {
  ComponentRecord c;
  c.plugin = j.at("plugin").get<std::string>();
  c.component = j.at("component").get<std::string>();
  c.version = j.at("version").get<std::string>();
  c.plugin_version = j.at("plugin_version").get<std::string>();
  unsigned ma = 0, mi = 0;
  std::sscanf(j.at("abi").get<std::string>().c_str(), "%u.%u", &ma, &mi);
  c.abi_major = ma;
  c.abi_minor = mi;
  c.options = j.at("options").get<std::map<std::string, std::string>>();
  return c;
}

}  // namespace

std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.pt", rank, world_size);
  return buf;
}

std::string Manifest::to_json() const {
  json shards_j = json::array();
  for (const auto& s : shards)
    shards_j.push_back(
        {{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes}, {"crc32", s.crc32}});
  json j = {{"format", kManifestFormat},
            {"step", step},
            {"world_size", world_size},
            {"host_abi", host_abi},
            {"algorithm", checkpoint::to_json(algorithm)},
            {"reducer", checkpoint::to_json(reducer)},
            {"optimizer", {{"name", optimizer}, {"options", optimizer_options}}},
            {"group_lr", group_lr},
            {"precision", precision},
            {"loss_scale", has_loss_scale ? json{{"scale", loss_scale.scale},
                                                 {"growth_tracker", loss_scale.growth_tracker},
                                                 {"skipped_steps", loss_scale.skipped_steps}}
                                          : json(nullptr)},
            {"extra", extra},
            {"schedule_phase", schedule_phase},
            {"epoch", epoch},
            {"autotune_bucket_cap_mb", autotune_bucket_cap_mb},
            {"autotune_overlap", autotune_overlap},
            {"autotune_hierarchical", autotune_hierarchical},
            {"shards", shards_j}};
  return j.dump(2) + "\n";
}

Manifest Manifest::from_json(const std::string& text, const std::string& file) {
  Manifest m;
  try {
    json j = json::parse(text);
    if (j.value("format", "") != kManifestFormat)
      throw CheckpointError("format is not " + std::string(kManifestFormat));
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.host_abi = j.at("host_abi").get<std::string>();
    m.algorithm = component_from(j.at("algorithm"));
    m.reducer = component_from(j.at("reducer"));
    m.optimizer = j.at("optimizer").at("name").get<std::string>();
    m.optimizer_options = j.at("optimizer").at("options").get<std::map<std::string, std::string>>();
    m.precision = j.at("precision").get<std::string>();
    m.group_lr = j.value("group_lr", std::vector<double>{});
    const json& ls = j.at("loss_scale");
    m.has_loss_scale = !ls.is_null();
    if (m.has_loss_scale) {
      m.loss_scale.scale = ls.at("scale").get<double>();
      m.loss_scale.growth_tracker = ls.at("growth_tracker").get<int64_t>();
      m.loss_scale.skipped_steps = ls.at("skipped_steps").get<int64_t>();
    }
    m.extra = j.at("extra").get<CheckpointExtra>();
    m.schedule_phase = j.value("schedule_phase", -1);
    m.epoch = j.value("epoch", int64_t{0});
    m.autotune_bucket_cap_mb = j.value("autotune_bucket_cap_mb", -1.0);
    m.autotune_overlap = j.value("autotune_overlap", -1);
    m.autotune_hierarchical = j.value("autotune_hierarchical", -1);
    for (const json& s : j.at("shards"))
      m.shards.push_back({s.at("rank").get<int>(), s.at("file").get<std::string>(),
                          s.at("bytes").get<uint64_t>(), s.at("crc32").get<uint32_t>()});
    if (m.world_size < 1 || m.shards.size() != static_cast<size_t>(m.world_size))
      throw CheckpointError("lists " + std::to_string(m.shards.size()) + " shards for world size " +
                            std::to_string(m.world_size));
    for (size_t r = 0; r < m.shards.size(); ++r)
      if (m.shards[r].rank != static_cast<int>(r) ||
          m.shards[r].file.find('/') != std::string::npos || m.shards[r].file.empty())
        throw CheckpointError("shard entry " + std::to_string(r) + " is malformed");
  } catch (const CheckpointError& e) {
    throw CheckpointError(file + ": " + e.what());
  } catch (const std::exception& e) {
    throw CheckpointError(file + ": invalid manifest: " + e.what());
  }
  return m;
}

CheckpointInfo Manifest::info(const std::string& path) const {
  CheckpointInfo i;
  i.path = path;
  i.step = step;
  i.world_size = world_size;
  i.algorithm = algorithm.plugin + "/" + algorithm.component;
  i.reducer = reducer.plugin + "/" + reducer.component;
  i.optimizer = optimizer;
  i.extra = extra;
  return i;
}

}  // namespace distopt::checkpoint
