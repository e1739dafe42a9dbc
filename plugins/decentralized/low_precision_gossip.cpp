#include "low_precision_gossip.hpp"

#include <ATen/core/grad_mode.h>

#include <string>

#include "distopt/sdk/base/tensor_state.hpp"
#include "minmax_uint8.hpp"
#include "minmax_uint8_torch.hpp"

namespace distopt::plugins::decentralized {

LowPrecisionGossip::LowPrecisionGossip(const dopt_bucket& bucket,
                                       const std::vector<at::Tensor>& params, const MixingRow& row,
                                       bool torch_codec)
    : bucket_(&bucket),
      params_(bucket, params, "decentralized"),
      row_(row),
      torch_codec_(torch_codec) {
  const at::Tensor flat = sdk::as_tensor(*bucket.flat);
  if (flat.scalar_type() != at::kFloat)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "decentralized: low_precision needs float32 parameters, bucket " +
                         std::to_string(bucket.index) + " is " +
                         std::string(at::toString(flat.scalar_type())));
  if (!flat.is_cpu() && !torch_codec_)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "decentralized: the host codec needs CPU buckets, bucket " +
                         std::to_string(bucket.index) + " is on " + flat.device().str());
  // Every buffer on the bucket's device.
  const at::TensorOptions f32 = flat.options().dtype(at::kFloat);
  self_ = at::zeros({flat.numel()}, f32);
  z_ = at::empty_like(self_);
  if (torch_codec_) decoded_ = at::empty_like(self_);  // the host codec adds in place
  send_ = at::empty({static_cast<int64_t>(message_bytes())}, flat.options().dtype(at::kByte));
  for (size_t i = 0; i < row_.links.size(); ++i) {
    copies_.push_back(at::zeros_like(self_));
    recv_.push_back(at::empty_like(send_));
  }
}

uint64_t LowPrecisionGossip::message_bytes() const {
  return minmax_uint8_bytes(static_cast<size_t>(self_.numel()), kMinMaxChunk);
}

uint64_t LowPrecisionGossip::state_bytes() const {
  return static_cast<uint64_t>(self_.numel()) * sizeof(float) * (1 + copies_.size());
}

void LowPrecisionGossip::start_exchange(sdk::CommView& comm, const at::Tensor& send,
                                        std::vector<at::Tensor>& recv, int32_t tag,
                                        RoundSchedule& round) {
  std::vector<int32_t> peers;
  for (const Link& l : row_.links) peers.push_back(l.peer);
  started_ = true;
  links_.start(comm, peers, send, recv, tag, round.one_at_a_time());
  round.add(links_);
}

uint64_t LowPrecisionGossip::start_sync(sdk::CommView& comm, int32_t tag, RoundSchedule& round) {
  at::NoGradGuard ng;
  params_.pack_into(self_);
  compressed_ = false;
  start_exchange(comm, self_, copies_, tag, round);
  return static_cast<uint64_t>(self_.numel()) * sizeof(float) * row_.links.size();
}

uint64_t LowPrecisionGossip::start(sdk::CommView& comm, int32_t tag, RoundSchedule& round) {
  at::NoGradGuard ng;
  z_.zero_();             // padding stays 0
  params_.pack_into(z_);  // x'_i
  z_.add_(self_, row_.self_weight - 2.0);
  for (size_t i = 0; i < row_.links.size(); ++i) z_.add_(copies_[i], row_.links[i].weight);
  if (torch_codec_)
    minmax_uint8_encode_torch(z_, static_cast<int64_t>(kMinMaxChunk), send_);
  else
    minmax_uint8_encode(z_.data_ptr<float>(), static_cast<size_t>(z_.numel()), kMinMaxChunk,
                        send_.data_ptr<uint8_t>());
  compressed_ = true;
  start_exchange(comm, send_, recv_, tag, round);
  return message_bytes() * row_.links.size();
}

void LowPrecisionGossip::finish() {
  at::NoGradGuard ng;
  try {
    links_.wait();
  } catch (...) {
    abandon();
    throw;
  }
  started_ = false;
  if (!compressed_) return;  // sync: the copies were received in place
  const size_t n = static_cast<size_t>(self_.numel());
  // Exact float adds of the decoded bytes: the same on every holder, with
  // either codec (the host one decodes and adds in one pass).
  auto apply = [&](const at::Tensor& message, at::Tensor& copy) {
    if (torch_codec_) {
      minmax_uint8_decode_torch(message, static_cast<int64_t>(kMinMaxChunk), decoded_);
      copy.add_(decoded_);
    } else {
      minmax_uint8_decode_add(message.data_ptr<uint8_t>(), n, kMinMaxChunk, copy.data_ptr<float>());
    }
  };
  apply(send_, self_);
  for (size_t i = 0; i < copies_.size(); ++i) apply(recv_[i], copies_[i]);
  params_.unpack(self_);
}

void LowPrecisionGossip::abandon() {
  links_.abandon();
  started_ = false;
}

at::Tensor LowPrecisionGossip::layout() const {
  at::Tensor t = at::empty({static_cast<int64_t>(3 * bucket_->num_entries)}, at::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t e = 0; e < bucket_->num_entries; ++e) {
    p[3 * e] = bucket_->entries[e].param_index;
    p[3 * e + 1] = static_cast<int64_t>(bucket_->entries[e].offset);
    p[3 * e + 2] = static_cast<int64_t>(bucket_->entries[e].numel);
  }
  return t;
}

void LowPrecisionGossip::save(sdk::StateWriter& w, const std::string& prefix) const {
  sdk::put_local(w, prefix + "layout", layout());
  sdk::put_local(w, prefix + "self", self_);
  for (size_t i = 0; i < copies_.size(); ++i)
    sdk::put_local(w, prefix + "peer" + std::to_string(row_.links[i].peer), copies_[i]);
}

bool LowPrecisionGossip::saved_in(const sdk::StateReader& r, const std::string& prefix) const {
  auto has = [&](const std::string& key) {
    sdk::StateInfo info;
    return r.find(key, &info) && static_cast<int64_t>(info.numel()) == self_.numel();
  };
  sdk::StateInfo info;
  if (!r.find(prefix + "layout", &info) || info.numel() != layout().numel()) return false;
  if (!at::equal(sdk::read_whole(r, prefix + "layout").view({-1}), layout())) return false;
  if (!has(prefix + "self")) return false;
  for (const Link& l : row_.links)
    if (!has(prefix + "peer" + std::to_string(l.peer))) return false;
  return true;
}

void LowPrecisionGossip::load(const sdk::StateReader& r, const std::string& prefix) {
  at::NoGradGuard ng;
  sdk::read_into(r, prefix + "self", 0, self_);
  for (size_t i = 0; i < copies_.size(); ++i)
    sdk::read_into(r, prefix + "peer" + std::to_string(row_.links[i].peer), 0, copies_[i]);
}

}  // namespace distopt::plugins::decentralized
