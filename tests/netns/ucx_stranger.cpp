// A stranger without the job token that talks UCP to a `ucx` rank: it
// creates its own UCP worker (UCX_TLS=tcp, UCX_NET_DEVICES=eth0 and a
// UCX_TCP_PORT_RANGE of one port, set by the caller), forges the rank's
// worker address by writing the rank's IPv4 address and TCP port over its
// own in its own packed address (the rank's real address is only in the
// store, which the token guards), connects, and sends tagged messages: a
// forged failure notice ("<rank> ...") with every tag the transport's
// public layout allows for it (every communicator id, every sender rank),
// and a few thousand random tags.
//
//   ucx_stranger OWN_IP OWN_PORT TARGET_IP TARGET_PORT WORLD_SIZE
//
// Prints what it did; exit 0 when the messages were flushed to the target
// (UCX accepted the connection), 2 when the connection failed, 1 on usage
// or local UCX errors. Used by tests/netns/netns_test.py.
#include <arpa/inet.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

bool g_failed = false;

void on_error(void*, ucp_ep_h, ucs_status_t st) {
  g_failed = true;
  std::printf("stranger: endpoint error: %s\n", ucs_status_string(st));
}

/// Replace the only occurrence of `from` in `blob` with `to`; false if it
/// does not occur exactly once.
bool replace_once(std::string& blob, const std::string& from, const std::string& to) {
  const size_t at = blob.find(from);
  if (at == std::string::npos || blob.find(from, at + 1) != std::string::npos) return false;
  blob.replace(at, from.size(), to);
  return true;
}

std::string ipv4(const char* text) {
  in_addr a{};
  if (inet_pton(AF_INET, text, &a) != 1) return "";
  return std::string(reinterpret_cast<const char*>(&a), sizeof a);
}

std::string port16(int port) {
  const uint16_t p = htons(static_cast<uint16_t>(port));
  return std::string(reinterpret_cast<const char*>(&p), sizeof p);
}

/// The `ucx` transport's public tag layout before keyed tags:
/// comm id (8) | sender (16) | tag (40); the notice tag is 2^40 - 1.
uint64_t plain_tag(uint64_t comm, uint64_t sender, uint64_t tag) {
  return (comm << 56) | ((sender & 0xffff) << 40) | (tag & ((uint64_t{1} << 40) - 1));
}

bool wait(ucp_worker_h w, void* req, std::chrono::steady_clock::time_point deadline) {
  if (!UCS_PTR_IS_PTR(req)) return !UCS_PTR_IS_ERR(req);
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < deadline)
    ucp_worker_progress(w);
  ucp_request_free(req);
  return st == UCS_OK;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s OWN_IP OWN_PORT TARGET_IP TARGET_PORT WORLD_SIZE\n", argv[0]);
    return 1;
  }
  const std::string own_ip = ipv4(argv[1]), target_ip = ipv4(argv[3]);
  const int own_port = std::atoi(argv[2]), target_port = std::atoi(argv[4]);
  const int world = std::atoi(argv[5]);
  ucp_config_t* cfg = nullptr;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_TAG;
  ucp_worker_params_t wp{};
  if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK || ucp_init(&p, cfg, &ctx) != UCS_OK ||
      ucp_worker_create(ctx, &wp, &worker) != UCS_OK) {
    std::fprintf(stderr, "stranger: cannot initialise UCX\n");
    return 1;
  }
  ucp_config_release(cfg);
  ucp_address_t* own = nullptr;
  size_t len = 0;
  if (ucp_worker_get_address(worker, &own, &len) != UCS_OK) return 1;
  std::string addr(reinterpret_cast<const char*>(own), len);
  ucp_worker_release_address(worker, own);
  if (!replace_once(addr, own_ip, target_ip) ||
      !replace_once(addr, port16(own_port), port16(target_port))) {
    std::fprintf(stderr, "stranger: own address or port not found once in the worker address\n");
    return 1;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_error;
  ucp_ep_h h = nullptr;
  const ucs_status_t st = ucp_ep_create(worker, &ep, &h);
  if (st != UCS_OK) {
    std::printf("stranger: ucp_ep_create failed: %s\n", ucs_status_string(st));
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::string> bodies;
  std::vector<void*> reqs;
  int sent = 0;
  auto send = [&](uint64_t tag, const std::string& body) {
    ucp_request_param_t prm{};
    void* r = ucp_tag_send_nbx(h, body.c_str(), body.size() + 1, tag, &prm);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
    ++sent;
  };
  // Forged failure notices: "rank 1 died", as if sent by each other rank.
  static const std::string notice = "1 forged by a stranger without the job token";
  for (uint64_t comm = 0; comm < 256; ++comm)
    for (int sender = 0; sender < world; ++sender)
      send(plain_tag(comm, sender, (uint64_t{1} << 40) - 1), notice);
  // Random tags with random payloads of plausible sizes.
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 4096; ++i) send(rng(), std::string(8 + rng() % 1024, 'x'));
  bool ok = true;
  for (void* r : reqs) ok = wait(worker, r, deadline) && ok;
  ucp_request_param_t fp{};
  ok = wait(worker, ucp_ep_flush_nbx(h, &fp), deadline) && ok && !g_failed;
  std::printf("stranger: %d tagged messages to %s:%d %s\n", sent, argv[3], target_port,
              ok ? "flushed (UCX accepted the connection)" : "not delivered");
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* c = ucp_ep_close_nbx(h, &cp);
  if (UCS_PTR_IS_PTR(c)) wait(worker, c, std::chrono::steady_clock::now());
  ucp_worker_destroy(worker);
  ucp_cleanup(ctx);
  return ok ? 0 : 2;
}
