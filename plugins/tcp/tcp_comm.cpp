// TcpComm: connection set-up and the hooks the SDK's p2p shell calls.
#include "tcp_comm.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "control_channel.hpp"
#include "distopt/sdk/base/options.hpp"

namespace distopt::plugins::tcp {

void Config::read_own(const sdk::OptionsView& o) {
  chunk_bytes = o.get_int("chunk_bytes");
  socket_buffer_bytes = o.get_int("socket_buffer_bytes");
  max_io_bytes = o.get_int("max_io_bytes");
}

namespace {
sdk::p2p::ShellSetup shell_setup() {
  sdk::p2p::ShellSetup s;
  s.component = "tcp";
  s.fallback = "TCP";
  s.default_scope = "tcp";
  s.default_bind = "127.0.0.1";
  // Its wait signals are atomic flags (add_wait_signals). Up to 4 MiB: a
  // calling-thread allreduce of that size takes about 200 us here.
  s.inline_shm_bytes = 4 << 20;
  return s;
}
}  // namespace

TcpComm::TcpComm(const dopt_create_args& args) : TcpComm(args, sdk::p2p::config_of<Config>(args)) {}

TcpComm::TcpComm(const dopt_create_args& args, const Config& cfg)
    : P2PCommunicator(args, cfg, shell_setup()), cfg_(cfg) {
  MeshArgs m;
  m.rank = rank();
  m.world_size = world_size();
  m.store = args.store;
  m.prefix = prefix();
  m.token = job_token();
  m.bind_address = bind_address();
  m.sockets.buffer_bytes = cfg.socket_buffer_bytes;
  m.deadline = deadline();
  try {
    mesh_ = build_mesh(m);
  } catch (const std::exception& e) {
    throw sdk::Error(DOPT_ERR_COMM,
                     std::string("create: rank ") + std::to_string(rank()) + ": " + e.what());
  }
  try {
    abort_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (abort_fd_ < 0) throw sdk::Error(DOPT_ERR_INTERNAL, "create: eventfd failed");
    SocketTransport::Options to;
    to.max_io = static_cast<size_t>(std::max<int64_t>(cfg_.max_io_bytes, 4096));
    to.abort = &aborting_;
    to.destroy = &destroying_now_;
    to.abort_fd = abort_fd_;
    to.fault = &fault();
    transport_ = std::make_unique<SocketTransport>(rank(), mesh_.out, mesh_.in, to);
    sdk::p2p::CollectiveOptions co;
    co.segment_bytes = static_cast<size_t>(std::max<int64_t>(cfg_.chunk_bytes, 4096));
    start(*transport_, co);  // the shm handshake, then the progress thread
    // Operations reach control_ only once this constructor has returned.
    control_ = std::make_unique<ControlChannel>(this, rank(), mesh_.ctrl);
  } catch (...) {
    shutdown();
    control_.reset();  // stops its thread before the sockets close
    mesh_.close_all();
    if (abort_fd_ >= 0) close(abort_fd_);
    throw;
  }
}

TcpComm::~TcpComm() {
  shutdown();        // aborts the running operation and everything queued
  control_->stop();  // goodbye to the peers, then they may see our sockets close
  control_.reset();
  mesh_.close_all();
  close(abort_fd_);
}

std::unique_ptr<sdk::Communicator> TcpComm::split_child(const dopt_create_args& a) {
  return std::unique_ptr<sdk::Communicator>(new TcpComm(a, cfg_));
}

void TcpComm::wake_transport() {
  uint64_t one = 1;
  (void)!write(abort_fd_, &one, sizeof one);
}

std::string TcpComm::describe_failure(dopt_status status, const std::string& cause,
                                      bool notify_peers) {
  // A timeout seen here: say which peers went silent (a cut link sends no
  // EOF), as the peer waited on may itself be waiting on one of them.
  std::string why = cause;
  if (status == DOPT_ERR_TIMEOUT && notify_peers && control_) {
    const std::string silent = control_->silence();
    if (!silent.empty()) why += "; " + silent;
  }
  return why;
}

void TcpComm::on_failure(dopt_status status, const std::string& why, bool notify_peers) {
  aborting_ = true;
  wake_transport();
  if (control_) control_->on_failure(status, why, notify_peers);
}

int TcpComm::failed_peer(std::string*) { return transport_->failed_peer(); }

void TcpComm::refine_failure(Result& r) {
  if (r.status != DOPT_ERR_COMM || r.peer < 0) return;
  // A data connection broke. The control channel knows why (the peer died,
  // aborted because a third rank died, or closed the communicator): give it
  // a moment to say so, so the message names the rank that really failed.
  auto until = Clock::now() + std::chrono::seconds(2);
  while (!failed(nullptr, nullptr) && !control_->said_bye(r.peer) && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (!failed(nullptr, nullptr) && control_->said_bye(r.peer))
    r.why = "rank " + std::to_string(r.peer) + " closed the communicator";
}

void TcpComm::add_wait_signals(sdk::shm::WaitCtx& c) {
  c.peer_left = control_ ? control_->bye_flags() : nullptr;  // a peer's goodbye
}

void TcpComm::take_bytes(uint64_t* sent, uint64_t* received) {
  transport_->take_bytes(sent, received);
}

void TcpComm::post_user(const std::shared_ptr<sdk::Completion>& req, bool is_send, int peer,
                        int32_t tag, const sdk::HostBuffer& b) {
  if (is_send)
    control_->post_send(peer, tag, b.data, b.bytes(), req);
  else
    control_->post_recv(peer, tag, b.data, b.bytes(), req);
}

}  // namespace distopt::plugins::tcp
