// The replicas' mean and consensus distance (algorithms with local
// replicas: decentralized, local SGD).
#include "base/services.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/optimizer_impl.hpp"

namespace distopt {

bool DistributedOptimizer::replicas_differ() const {
  return (impl_->build.algorithm.traits & DOPT_TRAIT_LOCAL_REPLICAS) != 0;
}

DistributedOptimizer::ReplicaAverage DistributedOptimizer::average_replicas() {
  auto& m = *impl_;
  at::NoGradGuard ng;
  std::vector<at::Tensor> flat;
  for (const auto& [name, t] : m.build.params)
    flat.push_back(t.detach().reshape({-1}).to(at::kFloat));
  at::Tensor all = flat.empty() ? at::zeros({0}) : at::cat(flat);
  const at::Tensor mine = all.clone();
  if (m.world_size > 1 && all.numel() > 0) {
    sdk::DLView v(all);
    const dopt_comm_ref c = optim::comm_for(m.build, v.get()->device.device_type);
    dopt_request* req = nullptr;
    const dopt_status st = c.vt->allreduce(c.comm, v.get(), v.get(), DOPT_REDUCE_SUM, &req);
    if (st != DOPT_OK)
      throw CommError(st, "communicator", "allreduce(parameter mean)", take_last_error());
    CommRequest(c.vt, req, "communicator:allreduce(parameter mean)").wait();
    all.div_(m.world_size);
  }
  ReplicaAverage out;
  int64_t off = 0;
  for (const auto& [name, t] : m.build.params) {
    const int64_t n = t.numel();
    out.params.emplace_back(name,
                            all.narrow(0, off, n).view(t.sizes()).to(t.scalar_type()).clone());
    off += n;
  }
  const double local = all.numel() > 0 ? (mine - all).pow(2).sum().item<double>() : 0.0;
  out.consensus_distance = m.world_size > 1
                               ? m.allreduce_scalar(static_cast<float>(local), DOPT_REDUCE_SUM,
                                                    "consensus distance, SUM") /
                                     m.world_size
                               : 0.0;
  return out;
}

}  // namespace distopt
