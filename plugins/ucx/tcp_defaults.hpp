// The UCX settings this plugin changes from UCX's own defaults, and the rule
// that the user's environment wins over them.
//
// Why: with UCX 1.13's defaults (UCX_TCP_TX_SEG_SIZE 8 KiB, RX 64 KiB) `ucx`
// with UCX_TLS=tcp reached about half of `tcp`'s allreduce bandwidth at
// 4-64 MiB on one host. The tx segment also sets where eager ends and
// rendezvous (a request/ready handshake, then the data as put_zcopy over
// up to UCX_MAX_RNDV_RAILS=2 TCP connections) begins: 8 KiB -> 64 KiB
// (`ucx_info -e -u t`). 64 KiB sent and 256 KiB received segments measured
// faster, the received one doing most (BENCHMARKS.md, "UCX over TCP": the
// tables and how sure they are); which per-fragment cost they save is not
// established. They cost memory only
// (UCX grows its buffer pools 8 segments at a time).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace distopt::plugins::ucx {

/// One UCX setting: its environment variable less "UCX_", the key
/// ucp_config_modify takes for it (a transport's field without the
/// transport's prefix: UCX 1.13 ignores "TCP_TX_SEG_SIZE" there, with a
/// warning) and its value in UCX's syntax.
struct UcxSetting {
  std::string name;
  std::string key;
  std::string value;
};

/// The plugin's defaults for UCX's tcp transport (see above).
inline std::vector<UcxSetting> tcp_defaults() {
  return {{"TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "256K"}, {"TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "64K"}};
}

/// The defaults to apply: those whose variable (UCX_<name>) is not set in
/// the environment `env` (a getenv-like lookup; std::getenv by default),
/// so a user's UCX_TCP_RX_SEG_SIZE or UCX_TCP_TX_SEG_SIZE always wins.
/// Settings from UCX's configuration file (ucx.conf) are not seen here and
/// lose against these. Thread safety: as thread-safe as `env`.
inline std::vector<UcxSetting> tcp_defaults_to_apply(const char* (*env)(const char*) = nullptr) {
  std::vector<UcxSetting> out;
  for (UcxSetting& s : tcp_defaults()) {
    const std::string var = "UCX_" + s.name;
    const char* v = env ? env(var.c_str()) : std::getenv(var.c_str());
    if (!v) out.push_back(std::move(s));
  }
  return out;
}

/// Apply tcp_defaults_to_apply() to `config` (from ucp_config_read, before
/// ucp_init). Returns the first failing ucp_config_modify's status and sets
/// *failed to its "NAME=value"; UCS_OK when all applied. Thread safety:
/// `config` must not be used concurrently.
inline ucs_status_t apply_tcp_defaults(ucp_config_t* config, std::string* failed) {
  for (const UcxSetting& d : tcp_defaults_to_apply()) {
    const ucs_status_t st = ucp_config_modify(config, d.key.c_str(), d.value.c_str());
    if (st != UCS_OK) {
      *failed = d.key + "=" + d.value;
      return st;
    }
  }
  return UCS_OK;
}

}  // namespace distopt::plugins::ucx
