#include "compress_common.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/tensor_state.hpp"

namespace distopt::plugins::compress {
namespace {

bool is_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

bool supported(DLDataType t) {
  return t.lanes == 1 && ((t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64)) ||
                          (t.code == kDLBfloat && t.bits == 16));
}

template <class T>
void load_as(const void* src, float* dst, size_t n) {
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
template <class T>
void store_as(const float* src, void* dst, size_t n) {
  T* d = static_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(src[i]);
}

void* data_of(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

}  // namespace

Kernels read_kernels(const char* component, const dopt_options* options) {
  const std::string k = sdk::OptionsView(options).get_string("kernels");
  if (k == "auto") return Kernels::kAuto;
  if (k == "cpu") return Kernels::kCpu;
  if (k == "generic") return Kernels::kGeneric;
  throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(component) +
                                                  ": option kernels must be auto, cpu or "
                                                  "generic, got '" +
                                                  k + "'");
}

std::vector<BucketLayout> read_layouts(const char* component, const dopt_bucket* buckets, size_t n,
                                       Kernels kernels) {
  std::vector<BucketLayout> out(n);
  for (size_t b = 0; b < n; ++b) {
    const dopt_bucket& bk = buckets[b];
    const std::string where = std::string(component) + ": bucket " + std::to_string(b);
    if (bk.index < 0 || static_cast<size_t>(bk.index) != b)
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, where + " has index " + std::to_string(bk.index));
    if (!bk.flat || bk.flat->ndim != 1 || !bk.flat->data)
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, where + ": flat buffer must be a 1-D tensor");
    const int32_t dev = bk.flat->device.device_type;
    if (dev != kDLCPU && dev != kDLCUDA)
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       where + ": only kDLCPU and kDLCUDA buckets are supported, not device type " +
                           std::to_string(dev));
    if (dev != kDLCPU && kernels == Kernels::kCpu)
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       where +
                           " is device memory: kernels: cpu reads host memory only (use "
                           "kernels: auto or generic)");
    if (bk.flat->strides && bk.flat->strides[0] != 1)
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, where + ": flat buffer is not contiguous");
    if (!supported(bk.flat->dtype))
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       where + ": dtype must be float32, float64, float16 or bfloat16");
    BucketLayout& l = out[b];
    l.length = sdk::dl_numel(*bk.flat);
    l.dtype = bk.flat->dtype;
    l.device = sdk::to_device(bk.flat->device);
    l.generic = kernels == Kernels::kGeneric || (kernels == Kernels::kAuto && dev != kDLCPU);
    for (size_t e = 0; e < bk.num_entries; ++e) {
      const dopt_bucket_entry& en = bk.entries[e];
      if (en.offset + en.numel > l.length)
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                         where + ": entry " + std::to_string(e) + " ends past the buffer");
      if (en.numel == 0) continue;
      Slice sl;
      sl.offset = en.offset;
      sl.numel = en.numel;
      // The host always names entries; a nameless one still gets a unique key.
      sl.name = en.name ? std::string(en.name)
                        : "bucket" + std::to_string(b) + ".entry" + std::to_string(e);
      if (en.ndim > 0 && en.shape) sl.shape.assign(en.shape, en.shape + en.ndim);
      size_t shape_numel = 1;
      for (int64_t d : sl.shape) shape_numel *= static_cast<size_t>(d);
      // A shape that disagrees with numel would make a bad checkpoint entry.
      if (sl.shape.empty() || shape_numel != en.numel) sl.shape = {static_cast<int64_t>(en.numel)};
      l.entries.push_back(std::move(sl));
      l.payload += en.numel;
    }
    if (l.length >= (size_t{1} << 32))
      throw sdk::Error(DOPT_ERR_UNSUPPORTED, where + ": more than 2^32 elements");
    if (l.generic && l.payload < l.length) {
      // Built once on the host, moved once: the per-step work stays on the device.
      std::vector<uint8_t> in_entry(l.length, 0);
      for (const Slice& e : l.entries) std::fill_n(in_entry.begin() + e.offset, e.numel, 1);
      std::vector<int64_t> pad;
      for (size_t i = 0; i < l.length; ++i)
        if (!in_entry[i]) pad.push_back(static_cast<int64_t>(i));
      l.pad_index = at::tensor(pad, at::kLong).to(l.device);
    }
  }
  return out;
}

const BucketLayout& layout_of(const char* component, const std::vector<BucketLayout>& layouts,
                              const dopt_bucket& bucket) {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= layouts.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     std::string(component) + ": bucket " + std::to_string(bucket.index) +
                         " was not among the " + std::to_string(layouts.size()) +
                         " buckets given to create");
  const BucketLayout& l = layouts[static_cast<size_t>(bucket.index)];
  if (!bucket.flat || sdk::dl_numel(*bucket.flat) != l.length ||
      !is_dtype(bucket.flat->dtype, l.dtype))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(component) + ": bucket " +
                                                    std::to_string(bucket.index) +
                                                    " changed length or dtype");
  return l;
}

void load_float(const DLTensor& flat, std::vector<float>& out) {
  const size_t n = sdk::dl_numel(flat);
  out.resize(n);
  const void* src = data_of(flat);
  if (flat.dtype.code == kDLBfloat) {
    load_as<c10::BFloat16>(src, out.data(), n);
  } else if (flat.dtype.bits == 16) {
    load_as<c10::Half>(src, out.data(), n);
  } else if (flat.dtype.bits == 64) {
    load_as<double>(src, out.data(), n);
  } else {
    std::memcpy(out.data(), src, n * sizeof(float));
  }
}

void store_float(const std::vector<float>& in, DLTensor& flat) {
  const size_t n = sdk::dl_numel(flat);
  if (in.size() != n) throw sdk::Error(DOPT_ERR_INTERNAL, "store_float: length mismatch");
  void* dst = data_of(flat);
  if (flat.dtype.code == kDLBfloat) {
    store_as<c10::BFloat16>(in.data(), dst, n);
  } else if (flat.dtype.bits == 16) {
    store_as<c10::Half>(in.data(), dst, n);
  } else if (flat.dtype.bits == 64) {
    store_as<double>(in.data(), dst, n);
  } else {
    std::memcpy(dst, in.data(), n * sizeof(float));
  }
}

at::Tensor load_work(const DLTensor& flat, const BucketLayout& l, bool zero_padding) {
  at::Tensor work = sdk::as_tensor(flat).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  if (zero_padding && l.pad_index.defined()) work.index_fill_(0, l.pad_index, 0.0);
  return work;
}

void store_work(const at::Tensor& work, const DLTensor& flat) { sdk::as_tensor(flat).copy_(work); }

DLTensor host_tensor(void* data, int64_t count, DLDataType dtype, int64_t* shape) {
  *shape = count;
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

bool StagedRequest::test() {
  std::lock_guard<std::mutex> lk(mu_);
  if (done_) return true;
  if (!h_.test()) return false;
  finish_();
  done_ = true;
  return true;
}

bool StagedRequest::wait(int64_t timeout_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  if (done_) return true;
  // CommHandle::wait throws (status + the communicator's detail) on failure
  // and on timeout, so returning from it means the collective succeeded.
  h_.wait(timeout_ms);
  finish_();
  done_ = true;
  return true;
}

CompressReducer::CompressReducer(const char* component, const dopt_create_args& args,
                                 dopt_comm_ref comm, const dopt_bucket* buckets, size_t num_buckets)
    : component_(component),
      kernels_(read_kernels(component, args.options)),
      comm_(comm),
      rank_(args.rank),
      world_size_(args.world_size) {
  if (!comm.vt || !comm.comm)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(component) + ": no communicator");
  if (comm_.world_size() != args.world_size)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(component) + ": communicator has " +
                                                    std::to_string(comm_.world_size()) +
                                                    " ranks, job has " +
                                                    std::to_string(args.world_size));
  layouts_ = read_layouts(component, buckets, num_buckets, kernels_);
}

std::vector<at::Tensor> CompressReducer::zero_buffers() const {
  std::vector<at::Tensor> out;
  for (const BucketLayout& l : layouts_)
    out.push_back(at::zeros({static_cast<int64_t>(l.length)},
                            at::TensorOptions().dtype(at::kFloat).device(l.device)));
  return out;
}

void CompressReducer::count_sent(uint64_t bytes) {
  bytes_sent_ += bytes;
  sdk::metric_add("reducer.bytes_sent", static_cast<double>(bytes));
}

void CompressReducer::save_rank_local(sdk::StateWriter& w, const std::string& prefix,
                                      const std::vector<at::Tensor>& residual) const {
  for (size_t b = 0; b < layouts_.size() && b < residual.size(); ++b) {
    if (!residual[b].defined()) continue;
    for (const Slice& e : layouts_[b].entries)
      // put_local copies to a contiguous host tensor (a view for host memory).
      sdk::put_local(w, prefix + e.name,
                     residual[b]
                         .narrow(0, static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel))
                         .view(e.shape));
  }
}

void CompressReducer::save_feedback_state(sdk::StateWriter& w,
                                          const std::vector<at::Tensor>& residual,
                                          MomentumCorrection& momentum) const {
  save_residuals(w, residual);
  if (momentum.enabled()) save_rank_local(w, kVelocityPrefix, momentum.buffers());
}

void CompressReducer::load_feedback_state(const sdk::StateReader& r,
                                          const std::vector<at::Tensor>& residual,
                                          MomentumCorrection& momentum) const {
  load_residuals(r, residual);
  if (momentum.enabled())
    load_rank_local(r, kVelocityPrefix, "momentum-correction velocity", momentum.buffers());
}

void CompressReducer::load_rank_local(const sdk::StateReader& r, const std::string& prefix,
                                      const std::string& what,
                                      const std::vector<at::Tensor>& residual) const {
  size_t missing = 0, loaded = 0;
  std::string first_missing;
  for (size_t b = 0; b < layouts_.size() && b < residual.size(); ++b) {
    if (!residual[b].defined()) continue;
    for (const Slice& e : layouts_[b].entries) {
      const std::string key = prefix + e.name;
      at::Tensor dst =
          residual[b].narrow(0, static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel));
      sdk::StateInfo info;
      if (!r.find(key, &info)) {
        dst.zero_();
        if (missing++ == 0) first_missing = key;
        continue;
      }
      if (info.numel() != static_cast<int64_t>(e.numel))
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                         std::string(component_) + ": checkpoint state '" + key + "' has " +
                             std::to_string(info.numel()) + " elements, the parameter has " +
                             std::to_string(e.numel));
      sdk::read_into(r, key, 0, dst);  // via a host tensor, whatever dst's device
      ++loaded;
    }
  }
  if (missing > 0 && rank_ == 0)
    sdk::log_warn(component_, "checkpoint has no " + what + " for " + std::to_string(missing) +
                                  " parameter(s) (first: '" + first_missing +
                                  "'); they start from zero");
  if (loaded > 0 && rank_ == 0 && r.saved_world_size() != world_size_)
    sdk::log_warn(component_, "checkpoint was saved by " + std::to_string(r.saved_world_size()) +
                                  " ranks, loading into " + std::to_string(world_size_) +
                                  ": every rank's " + what +
                                  " is the mean of the saved ranks' values");
}

}  // namespace distopt::plugins::compress

#include <algorithm>
#include <cmath>

namespace distopt::plugins::compress {

MomentumCorrection::MomentumCorrection(double momentum, bool masking,
                                       const std::vector<BucketLayout>& layouts)
    : momentum_(static_cast<float>(momentum)), masking_(masking) {
  if (!(momentum >= 0.0 && momentum < 1.0))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "option momentum must be in [0, 1), got " + std::to_string(momentum));
  if (enabled())
    for (const BucketLayout& l : layouts)
      velocity_.push_back(at::zeros({static_cast<int64_t>(l.length)},
                                    at::TensorOptions().dtype(at::kFloat).device(l.device)));
}

void MomentumCorrection::accumulate(size_t b, const Slice& e, float* g) {
  if (!enabled()) return;
  float* u = velocity_[b].data_ptr<float>() + e.offset;
  for (size_t i = 0; i < e.numel; ++i) g[i] = u[i] = momentum_ * u[i] + g[i];
}

void MomentumCorrection::accumulate(size_t b, at::Tensor& g) {
  if (!enabled()) return;
  // mul_ then add_ (not add(alpha), which may fuse): the CPU loop's roundings.
  velocity_[b].mul_(momentum_).add_(g);
  g.copy_(velocity_[b]);
}

void MomentumCorrection::sent(size_t b, const at::Tensor& index) {
  if (masking_ && enabled()) velocity_[b].index_fill_(0, index, 0.0);
}

std::vector<at::Tensor> MomentumCorrection::buffers() {
  std::vector<at::Tensor> out = velocity_;
  if (out.empty()) out.assign(1, at::Tensor());
  return out;
}

size_t keep_count(double ratio, size_t n, size_t min_k) {
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::min(n, std::max<size_t>(std::max<size_t>(1, min_k), static_cast<size_t>(k)));
}

SparseOptions SparseOptions::read(const char* component, const dopt_options* options) {
  sdk::OptionsView o(options);
  SparseOptions s;
  s.ratio = read_ratio(component, options);
  const int64_t min_k = o.get_int("min_k");
  if (min_k < 1)
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        std::string(component) + ": option min_k must be at least 1, got " + std::to_string(min_k));
  s.min_k = static_cast<size_t>(min_k);
  s.error_feedback = o.get_bool("error_feedback");
  s.momentum = o.get_double("momentum");
  s.momentum_masking = o.get_bool("momentum_masking");
  return s;
}

double read_ratio(const char* component, const dopt_options* options) {
  const double r = sdk::OptionsView(options).get_double("ratio");
  if (!(r > 0.0 && r <= 1.0))
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        std::string(component) + ": option ratio must be in (0, 1], got " + std::to_string(r));
  return r;
}

}  // namespace distopt::plugins::compress
