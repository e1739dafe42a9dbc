// The key tables (distopt/key_schema.hpp) against the parser: the reference
// printed from them must say what the parser does. For every key: it is not
// refused as unknown; its default parses; a number's range holds at both
// ends (a closed end accepted, an open end and just outside refused); every
// listed choice is accepted and another refused. And an unknown key's message
// lists exactly the table's keys.
#include "distopt/key_schema.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>

#include "distopt/config.hpp"
#include "distopt/error.hpp"

namespace {

// A job with `key: value` in section `path`. Sections that are not plain
// maps of values (the top level's, components', the optimizer's) are not
// numbers or choices and are checked only for "not unknown".
std::string job_with(const std::string& path, const std::string& key, const std::string& value) {
  const std::string kv = "{" + key + ": " + value + "}";
  if (path == "the top level") return key + ": " + value + "\n";
  if (path == "train.synthetic") return "train: {synthetic: " + kv + "}\n";
  if (path == "train.model") return "train: {model: " + kv + "}\n";
  if (path == "train.tensors") return "train: {dataset: tensors, tensors: " + kv + "}\n";
  // `dataset: tensors` needs its files named (the parser checks no file).
  if (path == "train" && key == "dataset" && value == "tensors")
    return "train: {dataset: tensors, tensors: {train: a.pt, test: b.pt}}\n";
  if (path == "reducer.inner") return "reducer: {name: hierarchical, inner: " + kv + "}\n";
  // Only the last phase may leave out a bound: this one gets one.
  if (path == "schedule[k]") return "schedule: [" + kv + ", {}]\n";
  if (path == "optimizer")
    return key == "name" ? "optimizer: " + kv + "\n"
                         : "optimizer: {name: sgd, " + key + ": " + value + "}\n";
  if (path == "optimizer.lr_schedule") {
    // Each key belongs to some kinds: put it under one that takes it.
    const std::map<std::string, std::string> kind_of = {
        {"warmup_steps", "step"},    {"warmup_start_factor", "step"},   {"step_size", "step"},
        {"gamma", "step"},           {"milestones", "multi_step"},      {"min_lr_factor", "cosine"},
        {"end_factor", "linear"},    {"total_steps", "one_cycle"},      {"pct_start", "one_cycle"},
        {"div_factor", "one_cycle"}, {"final_div_factor", "one_cycle"}, {"anneal", "one_cycle"}};
    std::string body;
    if (key == "kind" || key == "name")
      body = "{" + key + ": " + value + (value == "multi_step" ? ", milestones: [1]" : "") + "}";
    else
      body = "{name: " + kind_of.at(key) + ", " + key + ": " + value +
             (key != "milestones" && kind_of.at(key) == "multi_step" ? ", milestones: [1]" : "") +
             "}";
    return "optimizer: {name: sgd, lr_schedule: " + body + "}\n";
  }
  return path + ": " + kv + "\n";
}

// "" when the job parses, else the error message.
std::string parse_error(const std::string& yaml) {
  try {
    distopt::parse_job_config(yaml, "key_schema_test.yaml");
    return "";
  } catch (const distopt::Error& e) {
    return e.what();
  }
}

std::string number(double v, bool integer) {
  if (integer) return std::to_string(static_cast<long long>(v));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

TEST_CASE("every key in the tables is accepted by the parser, and its default parses") {
  for (const auto& s : distopt::config_sections()) {
    for (const auto& k : s.keys) {
      CAPTURE(s.path);
      CAPTURE(k.key);
      // Whatever the value does, the key itself is known.
      const std::string e = parse_error(job_with(s.path, k.key, "{}"));
      CHECK(e.find("unknown key") == std::string::npos);
      const std::string def = k.default_value;
      const bool literal = !def.empty() && def[0] != '(' && def != "{}" && def != "[]" &&
                           std::string(k.type) != "component";
      if (literal && std::string(s.path) != "the top level")
        CHECK(parse_error(job_with(s.path, k.key, def)) == "");
    }
  }
}

TEST_CASE("ranges and choices in the tables are the parser's") {
  const std::regex interval(R"(^([\[(])([^,]+), ([^\])]+)([\])])$)");
  int ranges = 0, choices = 0;
  for (const auto& s : distopt::config_sections()) {
    // A schedule's ranges interact (pct_start x total_steps, warm-up within
    // total_steps): lr_schedule_test checks them with their messages.
    if (std::string(s.path) == "optimizer.lr_schedule") continue;
    for (const auto& k : s.keys) {
      CAPTURE(s.path);
      CAPTURE(k.key);
      const std::string range = k.range, type = k.type, path = s.path;
      auto accepts = [&](const std::string& v) {
        CAPTURE(v);
        CHECK(parse_error(job_with(path, k.key, v)) == "");
      };
      auto refuses = [&](const std::string& v) {
        CAPTURE(v);
        CHECK(parse_error(job_with(path, k.key, v)).find(k.key) != std::string::npos);
      };
      std::smatch m;
      if ((type == "int" || type == "double") && std::regex_match(range, m, interval)) {
        ++ranges;
        const bool integer = type == "int";
        const bool lo_open = m[1] == "(", hi_open = m[4] == ")";
        const double lo = std::strtod(m[2].str().c_str(), nullptr);
        const std::string hi_text = m[3];
        const double hi = hi_text == "inf" ? INFINITY : std::strtod(hi_text.c_str(), nullptr);
        const double step = integer ? 1 : std::max(1e-6, std::fabs(lo) * 1e-6);
        if (lo_open) {
          refuses(number(lo, integer));
        } else {
          accepts(number(lo, integer));
        }
        refuses(number(lo - step, integer));
        // The parser reads the range from this row: its message quotes it.
        if (!integer)
          CHECK(parse_error(job_with(path, k.key, number(lo - step, false)))
                    .find("is out of range " + range) != std::string::npos);
        if (std::isinf(hi)) continue;
        const double hstep = integer ? 1 : std::max(1e-6, std::fabs(hi) * 1e-6);
        if (hi_open) {
          refuses(number(hi, integer));
          accepts(number((lo + hi) / 2, integer));
        } else {
          accepts(integer ? hi_text : number(hi, false));  // INT64_MAX stays exact as text
        }
        if (!(integer && hi >= 9.2e18)) refuses(number(hi + hstep, integer));
      } else if (type == "string" && range.find('|') != std::string::npos &&
                 range.find("://") == std::string::npos) {
        ++choices;
        size_t at = 0;
        while (at <= range.size()) {
          const size_t bar = std::min(range.find('|', at), range.size());
          const std::string c = range.substr(at, bar - at);
          // cuda needs a CUDA libtorch: config_test covers its refusal here.
          if (c.rfind("cuda", 0) != 0) accepts(c);
          at = bar + 1;
        }
        refuses("not_a_choice");
      }
    }
  }
  CHECK(ranges > 20);
  CHECK(choices >= 6);
}

TEST_CASE("an unknown key lists exactly the table's keys, with 'did you mean'") {
  for (const auto& s : distopt::config_sections()) {
    const std::string path = s.path;
    // The optimizer's keys are per optimizer, the schedule's per kind
    // (lr_schedule_test checks those messages).
    if (path == "optimizer" || path == "optimizer.lr_schedule") continue;
    CAPTURE(path);
    const std::string e = parse_error(job_with(path, "zzz_not_a_key", "1"));
    std::string keys;
    for (const auto& k : s.keys) keys += (keys.empty() ? "" : ", ") + std::string(k.key);
    CHECK(e.find("unknown key 'zzz_not_a_key'") != std::string::npos);
    CHECK(e.find("valid keys: " + keys) != std::string::npos);
  }
  CHECK(parse_error("train: {log_evry: 3}\n").find("did you mean 'log_every'?") !=
        std::string::npos);
}
