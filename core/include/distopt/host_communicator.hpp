// C++ owner of one communicator instance created through a plugin's vtable.
// Torch-free: tensors are DLTensors, so the CLI's `bench comm` needs no libtorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "distopt/communicator.h"
#include "distopt/registry.hpp"

namespace distopt {

class Store;
class Options;

/// An in-flight operation. Move-only; the destructor frees the request
/// (the operation's result is then discarded).
class CommRequest {
 public:
  CommRequest() = default;
  CommRequest(const dopt_communicator_v1* vt, dopt_request* req, std::string what);
  CommRequest(CommRequest&&) noexcept;
  CommRequest& operator=(CommRequest&&) noexcept;
  ~CommRequest();
  /// Block until done; throws CommError (naming the operation and the
  /// plugin's detail, e.g. the dead peer) on failure or timeout.
  /// timeout_ms < 0: the communicator's own timeout.
  void wait(int64_t timeout_ms = -1);
  /// Non-blocking; true when complete (throws like wait on failure).
  bool test();
  /// ABI 1.4 (distopt/communicator.h, "Device memory"): make `stream` (a
  /// cudaStream_t; nullptr: the legacy default stream) wait for a device
  /// operation without blocking the host. A host-memory request, or one of a
  /// communicator without stream_wait (ABI < 1.4), waits like wait(). Throws
  /// CommError like wait for a failure already known.
  void stream_wait(void* stream);

 private:
  const dopt_communicator_v1* vt_ = nullptr;
  dopt_request* req_ = nullptr;
  std::string what_;
};

/// Collective mismatch detection (the job's `world.collective_check_s`).
/// When a wait on a collective has not completed after `stall_after`, the
/// ranks publish what they wait on (kind, position, size, dtype) in `store`
/// and compare: if they issued different collectives every waiting rank
/// fails with CommError naming each rank's collective ("rank 0: allreduce
/// #117 of 2.1 MB float32 (avg); rank 1: barrier #3"), within a few
/// stall intervals instead of at the timeout. Nothing is exchanged while
/// waits complete within `stall_after`. Disabled when `store` is null or
/// stall_after <= 0. Same-size collectives that only differ in position
/// (one extra allreduce of the same shape) complete silently on transports
/// that match by size and are caught only where a later one stalls.
struct CollectiveCheck {
  std::shared_ptr<Store> store;
  std::chrono::milliseconds stall_after{1000};
  /// How long a failed collective waits for the other ranks' posts to say
  /// more than the transport (a dead peer never posts); negative: at most
  /// stall_after and 3 s. Elastic jobs use 0.
  std::chrono::milliseconds failure_patience{-1};
};

/// One rank's endpoint of a communicator. Not copyable. Methods may be called
/// from several threads, but collectives must be issued in the same order on
/// every rank.
class Communicator {
 public:
  /// Collective: create the instance (connects to peers through the store).
  /// Throws ComponentError / CommError with the plugin's detail.
  /// `check`: see CollectiveCheck (off by default).
  Communicator(const ComponentInfo& info, const dopt_create_args& args,
               const CollectiveCheck& check = {});
  /// Wrap an instance the plugin's own vtable made (takes ownership).
  Communicator(const ComponentInfo& info, dopt_comm* comm);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world_size() const;
  const std::string& name() const { return info_.name; }
  /// The reference the host hands reducers and algorithms. The ABI 1.4
  /// device rule (distopt/device_rule.hpp) applies to every call through it
  /// and through the operations below, before the plugin is called: a tensor
  /// on a device type not among devices() fails with
  /// ComponentError(DOPT_ERR_UNSUPPORTED) "<name>: <op> failed
  /// (UNSUPPORTED): communicator '<name>' does not accept kDLCUDA memory
  /// (it declares kDLCPU) ..." (through ref(): DOPT_ERR_UNSUPPORTED with that
  /// text in the error sink). The tensors' data is not touched.
  dopt_comm_ref ref() const { return {vt_, comm_}; }
  /// ABI 1.4: the device types it accepts (ComponentInfo::devices).
  uint32_t devices() const { return info_.devices; }
  /// ABI 1.4: the caller stream later device operations are ordered after
  /// (distopt/communicator.h, "Device memory"). Throws ComponentError
  /// (UNSUPPORTED) when the communicator has no set_stream.
  void set_stream(void* stream);

  CommRequest allreduce(const DLTensor& send, DLTensor& recv, dopt_reduce_op op);
  CommRequest reduce_scatter(const DLTensor& send, DLTensor& recv, dopt_reduce_op op);
  CommRequest allgather(const DLTensor& send, DLTensor& recv);
  CommRequest broadcast(DLTensor& buf, int root);
  CommRequest send(const DLTensor& buf, int peer, int tag);
  CommRequest recv(DLTensor& buf, int peer, int tag);
  CommRequest barrier();
  /// Collective; nullptr for color < 0.
  std::unique_ptr<Communicator> split(int color, int key);

 private:
  /// An instance already wrapped by the host (split's child).
  Communicator(const ComponentInfo& info, dopt_comm_ref wrapped);

  ComponentInfo info_;  // keeps the plugin library loaded
  const dopt_communicator_v1* vt_ = nullptr;
  dopt_comm* comm_ = nullptr;
};

/// A DLTensor over raw host memory: 1-D, contiguous, `count` elements.
/// `shape_storage` must outlive the returned tensor.
DLTensor make_dltensor(void* data, int64_t count, DLDataType dtype, int64_t* shape_storage);

}  // namespace distopt
