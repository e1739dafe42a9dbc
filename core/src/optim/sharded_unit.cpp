// ShardedUnit: the wrapper module that marks a unit of parameter sharding
// (distopt/sharded_unit.hpp). The gathering itself is optim/param_shards.cpp.
#include "distopt/sharded_unit.hpp"

#include <ostream>
#include <stdexcept>

namespace distopt {

ShardedUnitImpl::ShardedUnitImpl(torch::nn::AnyModule inner) : any_(std::move(inner)) {
  if (any_.is_empty()) throw std::invalid_argument("ShardedUnit: the module to wrap is empty");
  inner_ = any_.ptr();
  // The inner module's own parameters, buffers and children become this
  // module's, so names keep no extra level ("fc1.weight").
  for (auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

at::Tensor ShardedUnitImpl::forward(const at::Tensor& x) {
  return call([&] { return any_.forward<at::Tensor>(x); });
}

void ShardedUnitImpl::enter() {
  if (slot_->hooks) slot_->hooks->before_forward(slot_->unit);
}

void ShardedUnitImpl::leave(const at::Tensor& out) {
  if (slot_->hooks) slot_->hooks->after_forward(slot_->unit, out);
}

void ShardedUnitImpl::pretty_print(std::ostream& stream) const {
  stream << "distopt::ShardedUnit(";
  inner_->pretty_print(stream);
  stream << ")";
}

torch::nn::Sequential shard_units(const torch::nn::Sequential& seq) {
  torch::nn::Sequential out;
  const auto names = seq->named_children();
  size_t k = 0;
  for (const torch::nn::AnyModule& m : *seq) {
    std::string name = names[k++].key();
    if (auto unit = std::dynamic_pointer_cast<ShardedUnitImpl>(m.ptr()))
      out->push_back(std::move(name), unit);
    else
      out->push_back(std::move(name), ShardedUnit(m).ptr());
  }
  return out;
}

}  // namespace distopt
