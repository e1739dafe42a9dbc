// The ABI 1.4 device rule (distopt/abi.h dopt_component::devices): a
// component is handed only memory whose DLPack device type it declares
// (none declared: kDLCPU only; exact, so kDLCUDAHost must be listed itself).
// One implementation, applied by the host in three places: every call of
// distopt::Communicator, every call through a communicator reference the host
// hands a reducer or an algorithm (device_checked_comm), and the parameters'
// devices against the reducer's and algorithm's when an optimizer is built.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/communicator.h"

namespace distopt {

/// True when `device_type` (a DLDeviceType) is in the `devices` set.
bool device_accepted(uint32_t devices, int32_t device_type);

/// The rule's refusal: "" when `device_type` is accepted, else "<kind>
/// '<name>' does not accept kDLCUDA memory (it declares kDLCPU)". `kind`:
/// "communicator", "reducer", "algorithm". Thread-safe.
std::string device_refusal(const std::string& kind, const std::string& name, uint32_t devices,
                           int32_t device_type);

/// A communicator's refusal of tensor `t` (device_refusal, plus what to do):
/// "" when accepted. The data is not touched.
std::string comm_device_refusal(const std::string& comm_name, uint32_t devices, const DLTensor& t);

/// Wrap a communicator reference so that every operation taking tensors
/// (allreduce, reduce_scatter, allgather, broadcast, send, recv) first
/// applies comm_device_refusal to each of them: a refused call sets the
/// host's error sink to the refusal and returns DOPT_ERR_UNSUPPORTED without
/// calling `inner` (*req is NULL). Each issued request is wrapped (one small
/// allocation per operation): the wrapper's table is static because a
/// request may be freed after its communicator was destroyed
/// (communicator.h), and the wrapped request remembers `inner`'s table for
/// test / wait / request_free / stream_wait. split returns a
/// wrapped child; destroy destroys `inner` and the wrapper. Ownership of
/// `inner` moves to the wrapper. `comm_name` is the component's name
/// ("tcp"), `devices` its ComponentInfo::devices.
dopt_comm_ref device_checked_comm(dopt_comm_ref inner, const std::string& comm_name,
                                  uint32_t devices);

}  // namespace distopt
