// UcpTransport: UCP context/worker/endpoints and tagged requests.
#include "ucp_transport.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "distopt/sdk/base/host.hpp"
#include "listener_filter.hpp"
#include "tcp_defaults.hpp"

namespace distopt::plugins::ucx {

/// One peer's endpoint and its failure, set by UCX's error callback.
struct UcpTransport::Peer {
  UcpTransport* self = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  bool failed = false;
  std::string why;
};

namespace {

[[noreturn]] void ucx_error(const std::string& what, ucs_status_t st) {
  throw sdk::Error(DOPT_ERR_COMM, what + ": " + ucs_status_string(st));
}

template <class T>
void put(std::string& s, T v) {  // little-endian
  for (size_t i = 0; i < sizeof v; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <class T>
bool get(const std::string& s, size_t* at, T* v) {
  if (*at > s.size() || s.size() - *at < sizeof(T)) return false;
  *v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    *v |= static_cast<T>(static_cast<T>(static_cast<unsigned char>(s[*at + i])) << (8 * i));
  *at += sizeof(T);
  return true;
}

/// A peer's published bytes (see the constructor): its worker address, and
/// its host's addresses appended to `hosts`. False if malformed.
bool unpack(const std::string& s, std::string* worker, std::vector<uint32_t>* hosts) {
  size_t at = 0;
  uint32_t len = 0;
  uint16_t n = 0;
  if (!get(s, &at, &len) || s.size() - at < len) return false;
  *worker = s.substr(at, len);
  at += len;
  if (!get(s, &at, &n)) return false;
  for (uint16_t i = 0; i < n; ++i) {
    uint32_t a = 0;
    if (!get(s, &at, &a)) return false;
    hosts->push_back(a);
  }
  return at == s.size();
}

constexpr uint64_t kFullMask = ~uint64_t{0};
// The notice tag: bits 32..38 set, which neither collective nor user tags use.
constexpr uint64_t kNoticeTag = (uint64_t{1} << sdk::p2p::Tag::kTagBits) - 1;

}  // namespace

UcpTransport::UcpTransport(int rank, int world, uint8_t comm_id, bool peer_errors,
                           const std::string& token, bool source_filter)
    : rank_(rank),
      world_(world),
      comm_id_(comm_id),
      peer_errors_(peer_errors),
      source_filter_(source_filter),
      cipher_(token) {
  const std::vector<int> listening_before = listening_tcp4_fds();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);  // UCX_* environment
  if (st != UCS_OK) ucx_error("ucp_config_read", st);
  std::string failed;
  st = apply_tcp_defaults(config, &failed);  // only where UCX_<name> is unset
  if (st != UCS_OK) {
    ucp_config_release(config);
    ucx_error("ucp_config_modify " + failed, st);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) ucx_error("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    ucp_cleanup(context_);
    ucx_error("ucp_worker_create", st);
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    ucx_error("ucp_worker_get_address", st);
  }
  // Published: u32 length, the worker address, u16 count, IPv4 addresses.
  my_hosts_ = local_ipv4_addresses();
  put(address_, static_cast<uint32_t>(len));
  address_.append(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
  put(address_, static_cast<uint16_t>(my_hosts_.size()));
  for (uint32_t a : my_hosts_) put(address_, a);
  // The worker's listeners are the ones that appeared with it.
  for (int fd : listening_tcp4_fds())
    if (!std::binary_search(listening_before.begin(), listening_before.end(), fd))
      listeners_.push_back(fd);
  filter_listeners(my_hosts_);
}

void UcpTransport::filter_listeners(const std::vector<uint32_t>& hosts) {
  if (!source_filter_) return;
  for (int fd : listeners_)
    if (!allow_sources(fd, hosts))
      sdk::log_warn("ucx", "rank " + std::to_string(rank_) +
                               ": cannot filter a UCX listener by source address (" +
                               std::strerror(errno) + "): any host can connect to it");
}

UcpTransport::~UcpTransport() {
  for (auto& [h, op] : ops_)
    if (op.req) {
      if (op.recv) ucp_request_cancel(worker_, op.req);
      ucp_request_free(op.req);
    }
  ops_.clear();
  close(Clock::now());  // endpoints still open: no waiting
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

void UcpTransport::admit(const std::vector<std::string>& addresses) {
  workers_.assign(world_, std::string());
  std::vector<uint32_t> hosts = my_hosts_;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    if (!unpack(addresses.at(p), &workers_[p], &hosts))
      throw sdk::Error(DOPT_ERR_COMM, "rank " + std::to_string(p) +
                                          " published a malformed UCX address (another "
                                          "distopt version?)");
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  filter_listeners(hosts);
}

void UcpTransport::connect(const std::vector<std::string>& addresses) {
  if (workers_.empty()) admit(addresses);
  peers_.resize(world_);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    auto peer = std::make_unique<Peer>();
    peer->self = this;
    peer->rank = p;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(workers_[p].data());
    ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcpTransport::on_error;
    ep.err_handler.arg = peer.get();
    ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
    if (st != UCS_OK) ucx_error("rank " + std::to_string(p) + ": ucp_ep_create", st);
    peers_[p] = std::move(peer);
  }
  post_notices();
}

void UcpTransport::post_notices() {
  notice_in_.assign(world_, Notice{});
  notice_recv_.assign(world_, nullptr);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    ucp_request_param_t prm{};
    void* req = ucp_tag_recv_nbx(worker_, notice_in_[p].text, sizeof(Notice::text),
                                 ucp_tag(p, kNoticeTag), kFullMask, &prm);
    if (UCS_PTR_IS_PTR(req)) notice_recv_[p] = req;
  }
}

void UcpTransport::exchange_notices() {
  for (int p = 0; p < static_cast<int>(notice_recv_.size()); ++p) {
    void* req = notice_recv_[p];
    if (!req || ucp_request_check_status(req) == UCS_INPROGRESS) continue;
    const bool ok = ucp_request_check_status(req) == UCS_OK;
    ucp_request_free(req);
    notice_recv_[p] = nullptr;
    if (!ok) continue;
    // "<failed rank> <why>": fail that peer here as well, unless already known.
    Notice& n = notice_in_[p];
    n.text[sizeof n.text - 1] = 0;
    int failed = -1, used = 0;
    if (std::sscanf(n.text, "%d %n", &failed, &used) < 1 || failed < 0 || failed >= world_ ||
        failed == rank_ || !peers_[failed])
      continue;
    // The reported failure becomes the cause unless this rank had seen
    // another one first; p's own disconnect does not count (p's notice
    // explains it).
    if (!peers_[failed]->failed) {
      peers_[failed]->failed = true;
      peers_[failed]->why = std::string(n.text + used) + ", reported by rank " + std::to_string(p);
    }
    if (first_failed_ < 0) failed_at_ = Clock::now();
    if (first_failed_ < 0 || first_failed_ == p) first_failed_ = failed;
  }
  std::string why;
  const int failed = failed_peer(&why);
  if (failed < 0 || notified_) return;
  notified_ = true;
  notice_out_ = std::to_string(failed) + " " + why;
  notice_out_.resize(std::min(notice_out_.size(), sizeof(Notice::text) - 1));
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || !peers_[p] || peers_[p]->failed || !peers_[p]->ep) continue;
    ucp_request_param_t prm{};
    void* req = ucp_tag_send_nbx(peers_[p]->ep, notice_out_.data(), notice_out_.size() + 1,
                                 ucp_tag(rank_, kNoticeTag), &prm);
    if (UCS_PTR_IS_PTR(req)) notice_send_.push_back(req);
  }
}

void UcpTransport::throw_if_failed() {
  std::string why;
  if (failed_peer(&why) >= 0) throw sdk::Error(DOPT_ERR_COMM, why);
}

void UcpTransport::close(Clock::time_point deadline) {
  for (void*& req : notice_recv_)
    if (req) {
      ucp_request_cancel(worker_, req);
      ucp_request_free(req);
      req = nullptr;
    }
  for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
    Peer* peer = peers_[p].get();
    if (!peer || !peer->ep) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // After a failure everything is forced, without progress: UCX 1.13's
    // tcp transport can abort (uct_iface.h "comp->count > 0") when the
    // worker progresses the purge of a failed endpoint's sends.
    const bool force = first_failed_ >= 0;
    prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(peer->ep, &prm);
    while (!force && !quiesced_ && UCS_PTR_IS_PTR(req) &&
           ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    peer->ep = nullptr;
  }
  for (void* req : notice_send_) ucp_request_free(req);
  notice_send_.clear();
}

void UcpTransport::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failed) return;
  peer->failed = true;
  peer->why = "rank " + std::to_string(peer->rank) + ": connection lost (" +
              ucs_status_string(status) + ")";
  if (peer->self->first_failed_ < 0) {
    peer->self->first_failed_ = peer->rank;
    peer->self->failed_at_ = Clock::now();
  }
}

int UcpTransport::failed_peer(std::string* why) const {
  if (first_failed_ >= 0 && why) *why = peers_[first_failed_]->why;
  return first_failed_;
}

uint64_t UcpTransport::ucp_tag(int sender, uint64_t tag) const {
  return cipher_((uint64_t{comm_id_} << 56) | (static_cast<uint64_t>(sender & 0xffff) << 40) |
                 (tag & ((uint64_t{1} << sdk::p2p::Tag::kTagBits) - 1)));
}

Handle UcpTransport::add(Op op) {
  ops_.emplace(++next_, op);
  return next_;
}

Handle UcpTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  Peer* p = peers_.at(peer).get();
  Op op;
  op.peer = peer;
  op.bytes = bytes;
  if (p->failed) {
    op.status = UCS_ERR_CONNECTION_RESET;
    return add(op);
  }
  ucp_request_param_t prm{};
  void* req = ucp_tag_send_nbx(p->ep, data, bytes, ucp_tag(rank_, tag), &prm);
  bytes_sent_ += bytes;
  if (fault_) fault_->sent(bytes);
  if (UCS_PTR_IS_ERR(req))
    op.status = UCS_PTR_STATUS(req);
  else if (req == nullptr)
    op.status = UCS_OK;
  else
    op.req = req;
  return add(op);
}

Handle UcpTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  Op op;
  op.peer = peer;
  op.recv = true;
  op.bytes = bytes;
  sweep_states();
  RecvState* state = &states_.emplace_back();
  // Always a request and a callback: UCX 1.13 leaves recv_info's length 0
  // when a receive completes at once, so the length is taken from the callback.
  ucp_request_param_t prm{};
  prm.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = [](void*, ucs_status_t st, const ucp_tag_recv_info_t* i, void* user) {
    auto* s = static_cast<RecvState*>(user);
    s->status = st;
    s->length = st == UCS_OK && i ? i->length : 0;
    s->done = true;
  };
  prm.user_data = state;
  void* req = ucp_tag_recv_nbx(worker_, data, bytes, ucp_tag(peer, tag), kFullMask, &prm);
  if (UCS_PTR_IS_ERR(req)) {
    op.status = UCS_PTR_STATUS(req);
    state->done = state->released = true;
  } else {
    op.req = req;
    op.state = state;
  }
  return add(op);
}

void UcpTransport::sweep_states() {
  while (!states_.empty() && states_.front().done && states_.front().released) states_.pop_front();
}

bool UcpTransport::poll(Op& op) {
  if (op.req && op.status == UCS_INPROGRESS) {
    if (op.recv) {
      if (op.state->done) {
        op.status = op.state->status;
        op.received = op.state->length;
        op.state->released = true;
        op.state = nullptr;
      }
    } else {
      op.status = ucp_request_check_status(op.req);
    }
    if (op.status != UCS_INPROGRESS) {
      ucp_request_free(op.req);
      op.req = nullptr;
    }
  }
  if (op.status == UCS_OK && op.recv && op.received != op.bytes)
    op.status = UCS_ERR_MESSAGE_TRUNCATED;  // a shorter message than expected
  return op.status != UCS_INPROGRESS;
}

void UcpTransport::fail_op(const Op& op, const char* what) {
  std::string why;
  Peer* p =
      op.peer >= 0 && op.peer < static_cast<int>(peers_.size()) ? peers_[op.peer].get() : nullptr;
  if (op.status == UCS_ERR_MESSAGE_TRUNCATED)
    throw sdk::Error(DOPT_ERR_INTERNAL, std::string(what) + " from rank " +
                                            std::to_string(op.peer) + ": size mismatch (" +
                                            std::to_string(op.bytes) + " bytes expected, " +
                                            std::to_string(op.received) + " arrived)");
  throw sdk::Error(DOPT_ERR_COMM, p && p->failed
                                      ? p->why
                                      : "rank " + std::to_string(op.peer) + ": " + what +
                                            " failed (" + ucs_status_string(op.status) + ")");
}

bool UcpTransport::progress() {
  bool any = false;
  if (!quiesced_) {
    while (ucp_worker_progress(worker_)) any = true;
    exchange_notices();
  }
  if (hook_) hook_();
  return any;
}

bool UcpTransport::test(Handle h) {
  // Not progress(): the progress hook itself calls test().
  while (!quiesced_ && ucp_worker_progress(worker_)) {
  }
  Op& op = ops_.at(h);
  if (!poll(op)) return false;
  Op done = op;
  ops_.erase(h);
  if (done.status != UCS_OK) fail_op(done, done.recv ? "receive" : "send");
  return true;
}

void UcpTransport::release(const Handle* hs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    auto it = ops_.find(hs[i]);
    if (it == ops_.end()) continue;
    if (it->second.req) {
      if (it->second.recv) ucp_request_cancel(worker_, it->second.req);
      ucp_request_free(it->second.req);
    }
    if (it->second.state) it->second.state->released = true;  // erased once its callback ran
    ops_.erase(it);
  }
}

void UcpTransport::wait_all(const Handle* hs, size_t n, Clock::time_point deadline) {
  size_t idle = 0;
  while (true) {
    const bool moved = progress();
    const Op* pending = nullptr;
    bool errors = false;
    for (size_t i = 0; i < n; ++i) {
      Op& op = ops_.at(hs[i]);
      if (!poll(op)) {
        if (!pending) pending = &op;
      } else if (op.status != UCS_OK) {
        errors = true;
        if (failed_peer(nullptr) < 0) {
          // Not a peer failure (those wait for the grace period below).
          Op copy = op;
          quiesce(hs, n);
          fail_op(copy, op.recv ? "receive" : "send");
        }
      }
    }
    if (!pending && !errors) {  // done here, even if a peer failed meanwhile
      release(hs, n);
      return;
    }
    if (failed_peer(nullptr) >= 0 && (quiesced_ || Clock::now() >= failed_at_ + kGrace)) {
      quiesce(hs, n);
      throw_if_failed();
    }
    if (aborting_) {
      release(hs, n);
      throw sdk::Error(DOPT_ERR_ABORTED, "aborted (communicator destroyed)");
    }
    if (pending && Clock::now() >= deadline) {
      const int peer = pending->peer;
      const bool recv = pending->recv;
      quiesce(hs, n);
      throw sdk::Error(DOPT_ERR_TIMEOUT, std::string("timed out waiting for rank ") +
                                             std::to_string(peer) + " (" +
                                             (recv ? "receive" : "send") + " outstanding)");
    }
    // Spin while data moves; back off to yields, then short sleeps, so idle
    // ranks leave the cores to the ones that compute.
    idle = moved ? 0 : idle + 1;
    if (idle > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else if (idle > 100)
      sched_yield();
  }
}

void UcpTransport::quiesce(const Handle* hs, size_t n) {
  quiesced_ = true;
  release(hs, n);
}

}  // namespace distopt::plugins::ucx
