// UcxComm: creation (address exchange through the store) and the hooks the
// SDK's p2p shell calls.
#include "ucx_comm.hpp"

#include <string>
#include <vector>

#include "distopt/sdk/base/fnv1a.hpp"
#include "distopt/sdk/base/options.hpp"

namespace distopt::plugins::ucx {

void Config::read_own(const sdk::OptionsView& o) {
  small_bytes = o.get_int("small_bytes");
  segment_bytes = o.get_int("segment_bytes");
  peer_errors = o.get_bool("peer_errors");
  source_filter = o.get_bool("source_filter");
}

namespace {

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

/// Every rank's worker address, through the store (key <prefix>/ucx/addr/<rank>).
std::vector<std::string> exchange_addresses(const dopt_create_args& args, const std::string& prefix,
                                            const std::string& mine, double timeout_s) {
  std::vector<std::string> all(args.world_size);
  const std::string base = prefix + "/ucx/addr/";
  const std::string value = hex(mine);
  std::string k = base + std::to_string(args.rank);
  if (sdk::host()->store_set(args.store, k.c_str(), value.data(), value.size()) != DOPT_OK)
    throw sdk::Error(DOPT_ERR_COMM, "create: cannot publish the worker address under '" + k + "'");
  for (int p = 0; p < args.world_size; ++p) {
    if (p == args.rank) continue;
    k = base + std::to_string(p);
    std::string buf(4096, '\0');
    size_t len = 0;
    dopt_status st = sdk::host()->store_get(args.store, k.c_str(), buf.data(), buf.size(), &len,
                                            static_cast<int64_t>(timeout_s * 1000));
    if (st == DOPT_OK && len > buf.size()) {
      buf.resize(len);
      st = sdk::host()->store_get(args.store, k.c_str(), buf.data(), buf.size(), &len, 0);
    }
    if (st != DOPT_OK)
      throw sdk::Error(st == DOPT_ERR_TIMEOUT ? DOPT_ERR_TIMEOUT : DOPT_ERR_COMM,
                       "create: rank " + std::to_string(p) +
                           " did not publish its UCX worker address (key '" + k + "')");
    all[p] = unhex(buf.substr(0, len));
  }
  return all;
}

sdk::p2p::ShellSetup shell_setup() {
  sdk::p2p::ShellSetup s;
  s.component = "ucx";
  s.fallback = "UCX";
  s.default_scope = "ucx";
  s.poll_when_idle = true;  // a peer's rendezvous send or close may need this rank's progress
  return s;
}

}  // namespace

UcxComm::UcxComm(const dopt_create_args& args) : UcxComm(args, sdk::p2p::config_of<Config>(args)) {}

UcxComm::UcxComm(const dopt_create_args& args, const Config& cfg)
    : P2PCommunicator(args, cfg, shell_setup()), cfg_(cfg) {
  const int rank = this->rank(), world = world_size();
  if (world > 0xffff)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "create: ucx supports at most 65535 ranks");
  const auto comm_id = static_cast<uint8_t>(sdk::Fnv1a().chars(prefix()).digest() & 0xff);
  transport_ = std::make_unique<UcpTransport>(rank, world, comm_id, cfg_.peer_errors, job_token(),
                                              cfg_.source_filter);
  std::vector<std::string> addresses(world);
  if (world > 1) {
    addresses = exchange_addresses(args, prefix(), transport_->address(), cfg_.timeout_s);
    // Every rank's listeners take the job's hosts before any rank connects.
    transport_->admit(addresses);
    exchange_addresses(args, prefix() + "/admitted", "", cfg_.timeout_s);
  }
  transport_->connect(addresses);
  transport_->set_fault(&fault());
  transport_->set_progress_hook([this] { progress_user_ops(); });
  sdk::p2p::CollectiveOptions co;
  co.small_bytes = static_cast<size_t>(cfg_.small_bytes);
  co.segment_bytes = static_cast<size_t>(cfg_.segment_bytes);
  start(*transport_, co);  // the shm handshake, then the progress thread
}

UcxComm::~UcxComm() {
  shutdown();
  // The progress thread is gone: this thread owns the (serialized) worker now.
  transport_->close(Clock::now() + std::chrono::seconds(2));
}

std::unique_ptr<sdk::Communicator> UcxComm::split_child(const dopt_create_args& a) {
  return std::unique_ptr<sdk::Communicator>(new UcxComm(a, cfg_));
}

void UcxComm::wake_transport() { transport_->abort(); }

int UcxComm::failed_peer(std::string* why) { return transport_->failed_peer(why); }

void UcxComm::add_wait_signals(sdk::shm::WaitCtx& c) {
  c.peer_failed = [this](std::string* why) { return shm_failed_peer(why); };
}

int UcxComm::shm_failed_peer(std::string* why) {
  // At most every 5 ms: with more ranks than cores the peer being waited
  // for needs the CPU more than failure detection (which has a 1 s grace).
  const auto t = Clock::now();
  if (t < shm_polled_ + std::chrono::milliseconds(5)) return -1;
  shm_polled_ = t;
  transport_->progress();  // UCP error callbacks, failure notices, user send/recv
  std::string w;
  const int p = transport_->failed_peer(&w);
  if (p < 0) return -1;
  const auto now = Clock::now();
  if (shm_failure_seen_ == Clock::time_point{}) shm_failure_seen_ = now;
  if (now < shm_failure_seen_ + std::chrono::seconds(1)) return -1;  // UcpTransport's grace
  *why = w;
  return p;
}

void UcxComm::take_bytes(uint64_t* sent, uint64_t* received) {
  *sent = transport_->bytes_sent() - sent_taken_;
  sent_taken_ += *sent;
  *received = 0;  // UCX does not count them
}

bool UcxComm::idle_progress() { return transport_->progress(); }  // runs progress_user_ops()

void UcxComm::cancel(Handle h) { transport_->cancel(h); }

}  // namespace distopt::plugins::ucx
