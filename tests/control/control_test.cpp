// The control communicator: a job whose communicator accepts
// device memory only (`nccl` on a GPU; here the test-only `device_sim`,
// host memory labelled kDLCUDA and carried by tcp) gets a host-memory
// communicator beside it, and every collective the host makes in host
// memory goes there: parameter and buffer broadcasts of CPU tensors,
// evaluation sums, the loss-scale inf/NaN agreement, join counts, schedule
// switch and add_param_group agreements and state exchanges, checkpoint
// agreements, consolidate. The host's device rule refuses any kDLCPU tensor
// on device_sim before it is called, so a job that finishes proves the rule;
// its parameters must equal those of the same job over plain tcp.
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/utils.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 12, kClasses = 5, kBatch = 8;

// A model with buffers (BatchNorm's running statistics and step count), so
// that buffer synchronisation runs too.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, kClasses));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(at::relu(bn->forward(fc1->forward(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::string job_yaml(int world, const std::string& body) {
  std::ostringstream y;
  y << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "', '"
    << DISTOPT_CONTROL_PLUGIN_DIR << "']}\n"
    << "world: {size: " << world << ", rendezvous: 'tcp://127.0.0.1:" << random_port()
    << "', timeout_s: 60, collective_check_s: 0}\n"
    << body;
  return y.str();
}

std::vector<double> flat(const std::vector<at::Tensor>& ts) {
  std::vector<double> v;
  for (const auto& t : ts) {
    at::Tensor c = t.detach().to(at::kDouble).contiguous().view(-1);
    v.insert(v.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return v;
}

std::vector<at::Tensor> state_of(Net& net) {
  std::vector<at::Tensor> out = net->parameters();
  for (const auto& b : net->buffers()) out.push_back(b);
  return out;
}

void step(Net& net, distopt::DistributedOptimizer& opt, int rank, int k,
          const at::Tensor& extra = {}) {
  distopt::test::seed_cpu(1000 * k + rank);  // each rank its own batch
  opt.zero_grad();
  at::Tensor loss = at::cross_entropy_loss(net->forward(at::randn({kBatch, kIn})),
                                           at::randint(0, kClasses, {kBatch}));
  if (extra.defined()) loss = loss + 0.1 * (extra * extra).sum();
  opt.scale_loss(loss).backward();
  opt.step();
}

// The whole job on `world` ranks; per rank its final parameters and buffers,
// the evaluation sum and the loss scale, in dir/<what><rank>.bin.
void run_job(const std::string& dir, int world, const std::string& components) {
  const std::string ck = dir + "/ck";
  const std::string job = job_yaml(world, components +
                                              "algorithm: {name: allreduce}\n"
                                              "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                                              "precision: {dtype: fp32, loss_scale: dynamic}\n"
                                              "join: {enabled: true}\n");
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(rank);  // unequal: make_optimizer must broadcast rank 0's
        Net net;
        auto rt = rank_runtime(job, rank, world, "control.yaml");
        auto opt = rt.make_optimizer(*net);
        int k = 0;
        for (; k < 6; ++k) step(net, opt, rank, k);  // the schedule switches after step 3
        // add_param_group: agreement, then rank 0's values broadcast.
        distopt::test::seed_cpu(77 + rank);
        at::Tensor extra = at::randn({3}, at::requires_grad());
        opt.add_param_group({{"extra", extra}}, 0.01, 0);
        for (; k < 8; ++k) step(net, opt, rank, k, extra);
        // Uneven inputs: rank 0 steps twice more, the others join.
        if (rank == 0)
          for (; k < 10; ++k) step(net, opt, rank, k, extra);
        opt.join();
        // Evaluation-style sums on the host.
        at::Tensor sums = at::tensor({static_cast<double>(rank + 1), 0.5}, at::kDouble);
        rt.allreduce(sums, /*average=*/false);
        rt.barrier();
        // Checkpoint, then a fresh model and optimizer restore it.
        rt.save_checkpoint(ck, *net, opt, {}, 1);
        auto whole = rt.consolidate(*net, opt, 0);
        if (rank == 0 && whole.count("model/fc1.weight") == 0) return 3;
        const std::vector<double> saved = flat(state_of(net));
        Net fresh;
        auto opt2 = rt.make_optimizer(*fresh);
        opt2.add_param_group({{"extra", at::zeros({3}, at::requires_grad())}}, 0.01, 0);
        rt.load_checkpoint(ck, *fresh, opt2);
        if (flat(state_of(fresh)) != saved) return 4;
        std::vector<at::Tensor> all = state_of(fresh);
        all.push_back(extra);
        write_doubles(rank_file(dir, "params", rank), flat(all));
        write_doubles(rank_file(dir, "sums", rank), flat({sums}));
        write_doubles(rank_file(dir, "scale", rank), {opt2.loss_scale()});
        std::ofstream(rank_file(dir, "names", rank))
            << rt.communicator().name() << " " << rt.control_communicator().name();
        return 0;
      },
      std::chrono::seconds(240));
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(codes[r] == 0, "rank " << r);
}

const char* kDeviceComponents =
    "communicator: {name: device_sim}\n"
    "reducer: {name: device_mean}\n"
    "schedule:\n"
    "  - until_step: 3\n"
    "    algorithm: {name: allreduce}\n"
    "    reducer: {name: device_mean}\n"
    "  - algorithm: {name: allreduce}\n"
    "    reducer: {name: device_mean, options: {bucket_cap_mb: 0.0005}}\n";

const char* kTcpComponents =
    "communicator: {name: tcp}\n"
    "reducer: {name: mean}\n"
    "schedule:\n"
    "  - until_step: 3\n"
    "    algorithm: {name: allreduce}\n"
    "    reducer: {name: mean}\n"
    "  - algorithm: {name: allreduce}\n"
    "    reducer: {name: mean, options: {bucket_cap_mb: 0.0005}}\n";

}  // namespace

TEST_CASE("a device-only communicator gets a tcp control communicator for host memory") {
  const int world = 2;
  TempDir dir("distopt_control");
  const std::string job = job_yaml(world, "communicator: {name: device_sim}\n");
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        auto rt = rank_runtime(job, rank, world, "control.yaml");
        if (rt.communicator().name() != "device_sim") return 2;
        if (rt.control_communicator().name() != "tcp") return 3;
        at::Tensor t = at::tensor({static_cast<double>(rank + 1)}, at::kDouble);
        rt.allreduce(t, /*average=*/false);
        if (t.item<double>() != 3.0) return 4;
        std::vector<at::Tensor> b{at::full({4}, static_cast<float>(rank))};
        rt.broadcast(b, 1);
        if (!b[0].eq(1.0f).all().item<bool>()) return 5;
        rt.barrier();
        // The rule itself: host memory straight onto device_sim is refused.
        distopt::sdk::DLView v(t);
        try {
          rt.communicator().allreduce(*v.get(), *v.get(), DOPT_REDUCE_SUM).wait();
          return 6;
        } catch (const distopt::ComponentError& e) {
          if (e.status() != DOPT_ERR_UNSUPPORTED) return 7;
          if (std::string(e.what()).find("does not accept kDLCPU") == std::string::npos) return 8;
        }
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(codes[r] == 0, "rank " << r);
}

TEST_CASE("a job over a device-only communicator equals the same job over tcp") {
  const int world = 2;
  TempDir dev("distopt_control_dev"), tcp("distopt_control_tcp");
  run_job(dev.path, world, kDeviceComponents);
  run_job(tcp.path, world, kTcpComponents);
  CHECK(read_text(rank_file(dev.path, "names", 0)) == "device_sim tcp");
  CHECK(read_text(rank_file(tcp.path, "names", 0)) == "tcp tcp");
  for (int r = 0; r < world; ++r) {
    const auto a = read_doubles(rank_file(dev.path, "params", r));
    const auto b = read_doubles(rank_file(tcp.path, "params", r));
    CHECK_MESSAGE(max_abs_diff(a, b) <= 1e-6, "rank " << r);
    CHECK(read_doubles(rank_file(dev.path, "sums", r)) == std::vector<double>{3.0, 1.0});
    CHECK(read_doubles(rank_file(dev.path, "scale", r)) ==
          read_doubles(rank_file(tcp.path, "scale", r)));
  }
  // Every rank ends equal.
  CHECK(read_doubles(rank_file(dev.path, "params", 0)) ==
        read_doubles(rank_file(dev.path, "params", 1)));
}

TEST_CASE("control_communicator: explicit, and refused when it does not take host memory") {
  distopt::PluginRegistry reg;
  reg.discover({env_path("DISTOPT_PLUGIN_DIR"), DISTOPT_CONTROL_PLUGIN_DIR});
  SUBCASE("explicit tcp beside tcp is created") {
    auto cfg = distopt::parse_job_config(
        "communicator: {name: tcp}\ncontrol_communicator: {name: tcp, options: {shm: false}}\n",
        "ok.yaml");
    auto v = distopt::validate_job(cfg, reg, 2);
    CHECK(v.control_name == "tcp");
    CHECK(v.control_options.get_bool("shm") == false);
  }
  SUBCASE("none beside a host-memory communicator") {
    auto cfg = distopt::parse_job_config("communicator: {name: tcp}\n", "ok.yaml");
    CHECK(distopt::validate_job(cfg, reg, 2).control_name.empty());
  }
  SUBCASE("a device-only control communicator is refused at its key") {
    auto cfg = distopt::parse_job_config(
        "communicator: {name: device_sim}\ncontrol_communicator:\n  name: device_sim\n",
        "bad.yaml");
    std::string what;
    try {
      distopt::validate_job(cfg, reg, 2);
    } catch (const distopt::ConfigError& e) {
      what = e.what();
    }
    CHECK(what.find("bad.yaml:3:") != std::string::npos);
    CHECK(what.find("control_communicator.name") != std::string::npos);
    CHECK(what.find("kDLCUDA") != std::string::npos);
  }
  SUBCASE("an unknown control communicator is named") {
    auto cfg = distopt::parse_job_config("control_communicator: {name: gloo}\n", "bad.yaml");
    std::string what;
    try {
      distopt::validate_job(cfg, reg, 2);
    } catch (const distopt::ConfigError& e) {
      what = e.what();
    }
    CHECK(what.find("control_communicator") != std::string::npos);
    CHECK(what.find("gloo") != std::string::npos);
  }
}

TEST_CASE("distopt train over a device-only communicator: evaluation, checkpoint, resume") {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  REQUIRE_MESSAGE(read_text(data + "/t10k-labels-idx1-ubyte.gz").size() > 0,
                  "Fashion-MNIST missing: tools/setup.sh installs dataset-fashion-mnist");
  TempDir dir("distopt_control_cli");
  auto job = [&](const std::string& comm, const std::string& red, int epochs,
                 const std::string& name) {
    const std::string path = dir.path + "/" + name;
    std::ofstream(path) << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "', '"
                        << DISTOPT_CONTROL_PLUGIN_DIR << "']}\n"
                        << "world: {size: 2, timeout_s: 60}\n"
                        << "communicator: {name: " << comm << "}\nreducer: {name: " << red
                        << "}\nalgorithm: {name: allreduce}\n"
                        << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                        << "join: {enabled: true}\n"
                        << "train: {model: mlp, epochs: " << epochs
                        << ", batch_size: 64, seed: 3, max_steps: 20, log_every: 0, threads: 1}\n";
    return path;
  };
  auto train = [&](const std::string& cfg, const std::string& ck, bool resume) {
    std::vector<std::string> argv = {env_path("DISTOPT_CLI"), "train", cfg, "--checkpoint", ck};
    if (resume) argv.push_back("--resume");
    return run_command(argv, {}, std::chrono::seconds(300));
  };
  auto accuracy = [](const std::string& out) {
    const size_t p = out.find("final test accuracy: ");
    return p == std::string::npos ? std::string() : out.substr(p + 21, 6);
  };
  // Epoch 1 over device_sim (evaluation, checkpoint at its end), then epoch
  // 2 resumed from that checkpoint.
  const std::string ck = dir.path + "/ck_dev";
  ProcResult a = train(job("device_sim", "device_mean", 1, "dev1.yaml"), ck, false);
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output.find("communicator device_sim") != std::string::npos);
  CHECK(!accuracy(a.output).empty());
  ProcResult r = train(job("device_sim", "device_mean", 2, "dev2.yaml"), ck, true);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resume: ") != std::string::npos);
  // Both epochs uninterrupted over tcp end with the same accuracy.
  ProcResult t = train(job("tcp", "mean", 2, "tcp.yaml"), dir.path + "/ck_tcp", false);
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  CHECK(!accuracy(t.output).empty());
  CHECK(accuracy(r.output) == accuracy(t.output));
}
