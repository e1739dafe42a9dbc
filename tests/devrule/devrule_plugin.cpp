// Test-only components for the ABI 1.4 device rule (built into
// build/test-plugins/devrule, never build/plugins, which jobs scan).
// Torch-free.
//   algorithm `cuda_only`, reducer `cuda_only`: declare kDLCUDA memory only,
//     so the host must refuse them for a model on the CPU before they are
//     created (their constructors throw a message no test expects).
//   reducer `cuda_probe` (kDLCPU): at create, allreduces one float in host
//     memory through its dopt_comm_ref (SUM; must equal the world size), then
//     one whose DLTensor claims kDLCUDA (never dereferenced by the host) on
//     the same communicator or, with `via_split: true`, on a communicator
//     it split from it. The host's device rule must fail the second with
//     UNSUPPORTED before the communicator is called; create then fails with
//     the host's message (sdk::Error::reported keeps the error sink).
#include <string>

#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::devrule {

class CudaOnlyAlgorithm : public sdk::Algorithm {
 public:
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);
  explicit CudaOnlyAlgorithm(const dopt_algorithm_args&) {
    throw sdk::Error(DOPT_ERR_INTERNAL, "cuda_only algorithm: created (the host must refuse it)");
  }
  void on_bucket_ready(const dopt_bucket&) override {}
  void step() override {}
  void set_lr(int32_t, double) override {}
  uint64_t state_bytes() const override { return 0; }
};

class CudaOnlyReducer : public sdk::Reducer {
 public:
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);
  CudaOnlyReducer(const dopt_create_args&, dopt_comm_ref, const dopt_bucket*, size_t) {
    throw sdk::Error(DOPT_ERR_INTERNAL, "cuda_only reducer: created (the host must refuse it)");
  }
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket&) override { return nullptr; }
  uint64_t bytes_sent() const override { return 0; }
};

class CudaProbeReducer : public sdk::Reducer {
 public:
  CudaProbeReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket*, size_t) {
    sdk::CommView view(comm);
    float one = 1.0f;
    int64_t shape[1] = {1};
    DLTensor host{};
    host.data = &one;
    host.device = DLDevice{kDLCPU, 0};
    host.ndim = 1;
    host.dtype = DLDataType{kDLFloat, 32, 1};
    host.shape = shape;
    view.allreduce(host, host, DOPT_REDUCE_SUM).wait();
    if (one != static_cast<float>(args.world_size))
      throw sdk::Error(DOPT_ERR_INTERNAL, "cuda_probe: host allreduce gave " + std::to_string(one) +
                                              ", not the world size");
    DLTensor fake = host;
    fake.device = DLDevice{kDLCUDA, 0};  // a claim only: nothing may read it
    if (sdk::OptionsView(args.options).get_bool("via_split")) {
      sdk::OwnedComm child = view.split(0, args.rank);
      child.view().allreduce(fake, fake, DOPT_REDUCE_SUM).wait();
    } else {
      view.allreduce(fake, fake, DOPT_REDUCE_SUM).wait();
    }
    throw sdk::Error(DOPT_ERR_INTERNAL, "cuda_probe: the kDLCUDA allreduce was not refused");
  }
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket&) override { return nullptr; }
  uint64_t bytes_sent() const override { return 0; }
};

constexpr dopt_option_spec kProbeOptions[] = {
    sdk::option_bool("via_split", "false", "probe on a communicator split from the given one"),
};

}  // namespace distopt::plugins::devrule

namespace dr = distopt::plugins::devrule;

DOPT_PLUGIN("devrule", "1.0.0",
            DOPT_COMPONENT(dr::CudaOnlyAlgorithm, "cuda_only", "1.0.0",
                           "test-only: accepts kDLCUDA memory only", nullptr),
            DOPT_COMPONENT(dr::CudaOnlyReducer, "cuda_only", "1.0.0",
                           "test-only: accepts kDLCUDA memory only", nullptr),
            DOPT_COMPONENT(dr::CudaProbeReducer, "cuda_probe", "1.0.0",
                           "test-only: sends a kDLCUDA tensor through its communicator",
                           dr::kProbeOptions))
