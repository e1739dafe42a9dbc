// The allreduce algorithm across real processes on loopback (tcp + mean +
// allreduce plugins) matches a single process that sees the whole global
// batch; plus the BucketManager's hooks, the DLPack bridges and the optimizer
// factory in process.
//
// Forked children do all the torch work of the distributed cases (ranks and
// the single-process reference); they write their final parameters to files
// that the parent compares, so the parent never forks after using torch's
// thread pools.
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/optimizer_factory.hpp"
#include "multiproc.hpp"
#include "optim/bucket_manager.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10;
constexpr uint64_t kInitSeed = 42, kDataSeed = 1234;

// registered first so it is last in backward order; never used in forward,
// so its bucket only completes at step() (its gradient is zero)
struct NetImpl : torch::nn::Module {
  NetImpl() {
    unused = register_module("unused", torch::nn::Linear(4, 3));
    fc1 = register_module("fc1", torch::nn::Linear(kIn, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, kClasses));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc3->forward(at::relu(fc2->forward(at::relu(fc1->forward(x)))));
  }
  torch::nn::Linear unused{nullptr}, fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x), 1), y);  // mean over the batch
}

struct Data {
  at::Tensor x, y;
};
Data make_data(int64_t n) {
  distopt::test::seed_cpu(kDataSeed);
  return {at::randn({n, kIn}), at::randint(0, kClasses, {n})};
}

struct Spec {
  int world = 2;
  int batch = 8;  // per rank
  int steps = 20;
  std::string optimizer_yaml = "{name: sgd, lr: 0.05, momentum: 0.9}";
  std::string reducer_options = "{}";
  std::string algorithm_options = "{}";
  double clip = 0;  // reference: clip_grad_norm_ before each step
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> reference;
};

std::string tmpdir() { return make_temp_dir("distopt_optim"); }

void write_result(const std::string& path, Net& net, const std::vector<double>& extra) {
  std::ofstream f(path, std::ios::binary);
  std::vector<double> values(extra);
  values.insert(values.begin(), static_cast<double>(extra.size()));
  for (const auto& p : net->parameters()) {
    at::Tensor c = p.detach().to(at::kDouble).contiguous().view(-1);
    values.insert(values.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  f.write(reinterpret_cast<const char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(double)));
}

struct Result {
  std::vector<double> extra, params;
};
Result read_result(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<double> v;
  double d;
  while (f.read(reinterpret_cast<char*>(&d), sizeof d)) v.push_back(d);
  Result r;
  if (v.empty()) return r;
  size_t ne = static_cast<size_t>(v[0]);
  r.extra.assign(v.begin() + 1, v.begin() + 1 + ne);
  r.params.assign(v.begin() + 1 + ne, v.end());
  return r;
}

std::string job_yaml(const Spec& s, int port) {
  std::ostringstream y;
  y << plugins_and_world_yaml(s.world, port) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean, options: " << s.reducer_options << "}\n"
    << "algorithm: {name: allreduce, options: " << s.algorithm_options << "}\n"
    << "optimizer: " << s.optimizer_yaml << "\n";
  return y.str();
}

// Run the job on s.world ranks and the reference in another child; returns
// the per-rank results and the reference.
std::pair<std::vector<Result>, Result> run_case(const Spec& s) {
  std::string dir = tmpdir();
  const int64_t global = static_cast<int64_t>(s.world) * s.batch;
  auto ref_codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    Data d = make_data(global * s.steps);
    distopt::test::seed_cpu(kInitSeed);
    Net net;
    auto opt = s.reference(net->parameters());
    for (int step = 0; step < s.steps; ++step) {
      opt->zero_grad();
      auto x = d.x.narrow(0, step * global, global), y = d.y.narrow(0, step * global, global);
      loss_of(net, x, y).backward();
      if (s.clip > 0) torch::nn::utils::clip_grad_norm_(net->parameters(), s.clip);
      opt->step();
    }
    write_result(dir + "/ref.bin", net, {});
    return 0;
  });
  REQUIRE(ref_codes[0] == 0);

  const int port = random_port();
  const std::string yaml = job_yaml(s, port);
  auto codes = fork_ranks(
      s.world,
      [&](int rank) {
        torch::set_num_threads(1);
        Data d = make_data(global * s.steps);
        distopt::test::seed_cpu(kInitSeed + 7 * rank);  // only rank 0 starts like the reference
        Net net;
        auto rt = rank_runtime(yaml, rank, s.world, "equivalence.yaml");
        auto opt = rt.make_optimizer(*net);
        for (int step = 0; step < s.steps; ++step) {
          opt.zero_grad();
          auto x = d.x.narrow(0, step * global + rank * s.batch, s.batch);
          auto y = d.y.narrow(0, step * global + rank * s.batch, s.batch);
          loss_of(net, x, y).backward();
          opt.step();
        }
        write_result(dir + "/rank" + std::to_string(rank) + ".bin", net,
                     {static_cast<double>(opt.num_buckets()), static_cast<double>(opt.bytes_sent()),
                      static_cast<double>(opt.bytes_sent_plain_allreduce()),
                      static_cast<double>(opt.steps()), static_cast<double>(opt.state_bytes())});
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(240));
  for (int r = 0; r < s.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
  }
  std::vector<Result> ranks;
  for (int r = 0; r < s.world; ++r)
    ranks.push_back(read_result(dir + "/rank" + std::to_string(r) + ".bin"));
  Result ref = read_result(dir + "/ref.bin");
  distopt::test::remove_tree(dir);
  return {ranks, ref};
}

// Every rank ends equal to the reference (to 1e-5) and to rank 0.
void check_equivalent(const std::vector<Result>& ranks, const Result& ref, int steps) {
  REQUIRE(!ref.params.empty());
  for (size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(ranks[r].params, ref.params) <= 1e-5);
    CHECK(max_abs_diff(ranks[r].params, ranks[0].params) <= 1e-6);
    REQUIRE(ranks[r].extra.size() == 5);
    CHECK(ranks[r].extra[3] == steps);
    // the mean reducer sends exactly what a ring allreduce of the buckets would
    CHECK(ranks[r].extra[1] == ranks[r].extra[2]);
    CHECK(ranks[r].extra[2] > 0);
  }
}

std::unique_ptr<torch::optim::Optimizer> ref_sgd(std::vector<at::Tensor> p, double lr = 0.05) {
  return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr).momentum(0.9));
}
std::unique_ptr<torch::optim::Optimizer> ref_adam(std::vector<at::Tensor> p) {
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
}

}  // namespace

TEST_CASE("allreduce + SGD(momentum 0.9) on 2 ranks matches one process with the global batch") {
  Spec s;
  s.world = 2;
  s.reference = [](auto p) { return ref_sgd(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);
  // momentum buffers of the 4 trainable tensors pairs, fp32
  const double trainable = 4 * 3 + 3 + kIn * 32 + 32 + 32 * 16 + 16 + 16 * kClasses + kClasses;
  CHECK(ranks[0].extra[4] == trainable * 4);
}

TEST_CASE("allreduce + Adam on 2 ranks matches one process with the global batch") {
  Spec s;
  s.world = 2;
  s.optimizer_yaml = "{name: adam, lr: 0.01}";
  s.reference = [](auto p) { return ref_adam(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);
}

TEST_CASE("4 ranks, SGD, many tiny buckets") {
  Spec s;
  s.world = 4;
  s.reducer_options = "{bucket_cap_mb: 0.001, align_bytes: 64}";
  s.reference = [](auto p) { return ref_sgd(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);
  CHECK(ranks[0].extra[0] >= 5);  // several buckets were really used
}

TEST_CASE("4 ranks, Adam, overlap: false (every bucket launched at step)") {
  Spec s;
  s.world = 4;
  s.optimizer_yaml = "{name: adam, lr: 0.01}";
  s.reducer_options = "{overlap: false, bucket_cap_mb: 0.002}";
  s.reference = [](auto p) { return ref_adam(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);
}

TEST_CASE("grad_clip matches clip_grad_norm_ in the single-process reference") {
  Spec s;
  s.world = 2;
  s.algorithm_options = "{grad_clip: 0.05}";
  s.clip = 0.05;
  s.reference = [](auto p) { return ref_sgd(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);

  // ...and clipping really changed the result (else the test proves nothing)
  Spec plain = s;
  plain.algorithm_options = "{}";
  plain.clip = 0;
  plain.steps = s.steps;
  auto [ranks2, ref2] = run_case(plain);
  CHECK(max_abs_diff(ranks2[0].params, ranks[0].params) > 1e-4);
}

TEST_CASE("divide_before gives the same mean; average_world: false gives the sum") {
  Spec s;
  s.world = 2;
  s.steps = 10;
  s.algorithm_options = "{divide_before: true}";
  s.reference = [](auto p) { return ref_sgd(p); };
  auto [ranks, ref] = run_case(s);
  check_equivalent(ranks, ref, s.steps);

  // Summed gradients = W x the mean: SGD with momentum is linear in the
  // gradient, so it equals the reference with lr x W.
  Spec sum = s;
  sum.algorithm_options = "{average_world: false, divide_before: true}";
  sum.reference = [w = s.world](auto p) { return ref_sgd(p, 0.05 * w); };
  auto [ranks2, ref2] = run_case(sum);
  check_equivalent(ranks2, ref2, sum.steps);
}

TEST_CASE("misuse fails loudly: zero_grad mid-step, bad group, second backward") {
  std::string dir = tmpdir();
  Spec s;
  s.world = 1;
  s.reducer_options = "{bucket_cap_mb: 0.001}";  // fc3's bucket launches during backward
  const std::string yaml = job_yaml(s, random_port());
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    int failures = 0;
    auto expect = [&](bool ok, const char* what) {
      if (!ok) {
        std::fprintf(stderr, "FAILED: %s\n", what);
        ++failures;
      }
    };
    Data d = make_data(16);
    Net net;
    distopt::ProcessInfo proc;
    auto rt = distopt::Runtime::from_config(distopt::parse_job_config(yaml, "misuse.yaml"), proc);
    auto opt = rt.make_optimizer(*net);
    expect(opt.num_buckets() > 1, "several buckets");
    // gradients are views into the bucket
    expect(net->fc1->weight.grad().defined(), "grad defined after make_optimizer");
    loss_of(net, d.x, d.y).backward();
    try {
      opt.zero_grad();
      expect(false, "zero_grad after backward must throw");
    } catch (const distopt::Error& e) {
      expect(std::string(e.what()).find("step()") != std::string::npos,
             "zero_grad message names step()");
    }
    try {
      loss_of(net, d.x, d.y).backward();
      expect(false, "second backward after launch must throw");
    } catch (const std::exception& e) {
      expect(std::string(e.what()).find("second gradient") != std::string::npos,
             "second backward message");
    }
    opt.step();
    expect(opt.steps() == 1, "one step");
    try {
      opt.set_lr(0.1, 3);
      expect(false, "set_lr on a missing group must throw");
    } catch (const distopt::ComponentError& e) {
      expect(e.status() == DOPT_ERR_INVALID_ARGUMENT, "set_lr status");
    }
    opt.set_lr(0.2, 0);
    // a user's module.zero_grad() (grads set to None) is repaired
    net->zero_grad();
    opt.zero_grad();
    expect(net->fc1->weight.grad().defined() &&
               net->fc1->weight.grad().abs().sum().item<double>() == 0,
           "zero_grad re-points grads at the zeroed bucket");
    loss_of(net, d.x, d.y).backward();
    opt.step();
    expect(opt.bytes_sent() == 0 && opt.bytes_sent_plain_allreduce() == 0,
           "one rank sends nothing");
    return failures;
  });
  CHECK(codes[0] == 0);
  distopt::test::remove_tree(dir);
}

TEST_CASE("a bad optimizer option fails make_optimizer with the plugin's message") {
  Spec s;
  s.world = 1;
  s.optimizer_yaml = "{name: sgd, lr: 0.1, nesterov: true}";  // nesterov without momentum
  const std::string yaml = job_yaml(s, random_port());
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    Net net;
    auto rt = distopt::Runtime::from_config(distopt::parse_job_config(yaml, "bad.yaml"),
                                            distopt::ProcessInfo{});
    try {
      rt.make_optimizer(*net);
    } catch (const distopt::ComponentError& e) {
      std::string m = e.what();
      return (e.status() == DOPT_ERR_INVALID_ARGUMENT && m.find("nesterov") != std::string::npos &&
              m.find("allreduce") != std::string::npos)
                 ? 0
                 : 2;
    }
    return 1;
  });
  CHECK(codes[0] == 0);
}

// ---- in-process tests (small tensors, one thread) ----

TEST_CASE("BucketManager launches buckets in order during backward; unused ones at finish") {
  at::set_num_threads(1);
  // registration: a, unused, b, c -> backward order c, b, unused, a
  auto a = at::randn({3, 4}).requires_grad_(true);
  auto unused = at::randn({5}).requires_grad_(true);
  auto b = at::randn({4, 4}).requires_grad_(true);
  auto c = at::randn({4}).requires_grad_(true);
  std::vector<std::pair<std::string, at::Tensor>> params = {
      {"a", a}, {"unused", unused}, {"b", b}, {"c", c}};
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    std::vector<int> launched;
    bool in_backward = false;
    std::vector<bool> launched_in_backward;
    distopt::optim::BucketOptions o;
    o.cap_bytes = 1;  // one parameter per bucket
    o.align_bytes = 8;
    o.overlap = overlap;
    distopt::optim::BucketManager bm(params, o, [&](const dopt_bucket& bk) {
      launched.push_back(bk.index);
      launched_in_backward.push_back(in_backward);
    });
    REQUIRE(bm.num_buckets() == 4);
    CHECK(std::string(bm.buckets()[0].entries[0].name) == "c");
    CHECK(std::string(bm.buckets()[2].entries[0].name) == "unused");
    // .grad is a view of the bucket
    CHECK(a.grad().data_ptr() == bm.grad_view(0).data_ptr());
    CHECK(bm.buckets()[3].flat->data == bm.grad_view(0).data_ptr());

    in_backward = true;
    auto loss = (at::matmul(at::matmul(a, b), c)).sum();
    loss.backward();
    in_backward = false;
    if (overlap) {
      // c and b complete during backward; "unused" blocks the rest until finish
      REQUIRE(launched.size() == 2);
      CHECK(launched_in_backward[0]);
      CHECK(launched_in_backward[1]);
    } else {
      CHECK(launched.empty());
    }
    bm.finish();
    REQUIRE(launched.size() == 4);
    for (int k = 0; k < 4; ++k) CHECK(launched[k] == k);
    // gradients accumulated in place into the bucket
    auto expect_a = at::matmul(c.detach(), b.detach().t()).unsqueeze(0).expand({3, 4});
    CHECK(at::allclose(bm.grad_view(0), expect_a));
    CHECK(bm.grad_view(1).abs().sum().item<double>() == 0);
    bm.zero_grad();
    CHECK(a.grad().abs().sum().item<double>() == 0);
  }
}

TEST_CASE("DLPack bridges alias memory both ways") {
  at::Tensor t = at::arange(12, at::kFloat).view({3, 4});
  distopt::sdk::DLView v(t);
  CHECK(v.get()->ndim == 2);
  CHECK(v.get()->shape[1] == 4);
  CHECK(v.get()->dtype.code == kDLFloat);
  at::Tensor back = distopt::sdk::as_tensor(*v.get());
  CHECK(back.data_ptr() == t.data_ptr());
  back.mul_(2);
  CHECK(t[2][3].item<float>() == 22.0f);
  // a strided view keeps its strides
  at::Tensor col = t.select(1, 1);
  distopt::sdk::DLView vc(col);
  at::Tensor col2 = distopt::sdk::as_tensor(*vc.get());
  CHECK(col2.stride(0) == 4);
  CHECK(at::equal(col2, col));
  // moving the view keeps a valid DLTensor
  distopt::sdk::DLView moved(std::move(v));
  CHECK(moved.get()->shape[0] == 3);
  DLTensor bad = *moved.get();
  bad.dtype = {kDLFloat, 8, 1};
  CHECK_THROWS_AS(distopt::sdk::as_tensor(bad), distopt::sdk::Error);
  CHECK((distopt::sdk::to_scalar_type({kDLBfloat, 16, 1}) == at::kBFloat16));
}

TEST_CASE("optimizer factory: every optimizer, group overrides, state bytes, errors") {
  distopt::sdk::set_host(distopt::host_api());
  for (const char* name : {"sgd", "adam", "adamw", "adagrad", "rmsprop"}) {
    CAPTURE(name);
    auto opts = distopt::Options::validate(
        YAML::Load("{lr: 0.5}"), distopt::optimizer_option_specs(name), "<t>", "optimizer");
    at::Tensor p1 = at::ones({4}), p2 = at::ones({2});
    p1.mutable_grad() = at::ones({4});
    p2.mutable_grad() = at::ones({2});
    distopt::sdk::ParamGroupInput g0{{p1}}, g1{{p2}, 0.1, 0.0};
    auto opt =
        distopt::sdk::make_optimizer(name, distopt::sdk::OptionsView(opts.c_handle()), {g0, g1});
    REQUIRE(opt->param_groups().size() == 2);
    CHECK(opt->param_groups()[0].options().get_lr() == doctest::Approx(0.5));
    CHECK(opt->param_groups()[1].options().get_lr() == doctest::Approx(0.1));
    opt->step();
    CHECK(p1[0].item<float>() < 1.0f);  // it stepped
    uint64_t sb = distopt::sdk::optimizer_state_bytes(*opt);
    if (std::string(name) == "sgd")
      CHECK(sb == 0);  // no momentum, no state
    else
      CHECK(sb >= 6 * 4);
    distopt::sdk::set_group_lr(*opt, 1, 0.25);
    CHECK(opt->param_groups()[1].options().get_lr() == doctest::Approx(0.25));
    CHECK_THROWS_AS(distopt::sdk::set_group_lr(*opt, 2, 0.1), distopt::sdk::Error);
  }
  auto adam = distopt::Options::validate(YAML::Node(), distopt::optimizer_option_specs("adam"),
                                         "<t>", "optimizer");
  at::Tensor p = at::zeros({10});
  p.mutable_grad() = at::ones({10});
  auto opt =
      distopt::sdk::make_optimizer("adam", distopt::sdk::OptionsView(adam.c_handle()), {{{p}}});
  opt->step();
  CHECK(distopt::sdk::optimizer_state_bytes(*opt) == 2 * 10 * 4);
  CHECK_THROWS_AS(
      distopt::sdk::make_optimizer("lbfgs", distopt::sdk::OptionsView(adam.c_handle()), {}),
      distopt::sdk::Error);
}
