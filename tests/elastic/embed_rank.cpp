// One rank of an embedding program with elastic training (distopt/elastic.hpp),
// started by embed_test through `distopt launch --elastic --config JOB`:
// a Linear(4, 3) trained by SGD on deterministic global batches of 6 rows,
// split among the ranks alive. Usage: embed_rank OUT STEPS DIE_RANK DIE_STEP
// (the process that started as DIE_RANK exits before step DIE_STEP; -1: none;
// JOIN_STEP: see below).
// Every rank writes its parameters to OUT.<its final rank>, one value per
// line. Restarted (DISTOPT_RESTART_COUNT > 0), it joins the running ranks.
// EMBED_EXIT_AFTER_JOIN=K in the environment: a process that joined a
// running job exits (code 137) K steps after it was taken in.
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/elastic.hpp"
#include "distopt/runtime.hpp"
#include "distopt/store.hpp"

namespace {

constexpr int64_t kGlobal = 6;

// Global batch `step`: the same on every rank and in the test's reference.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step) {
  auto i = torch::arange(kGlobal * 4, torch::kFloat);
  auto x = torch::sin(i * static_cast<double>(step + 1) * 0.37).view({kGlobal, 4});
  auto y =
      torch::cos(torch::arange(kGlobal * 3, torch::kFloat) * static_cast<double>(step + 2) * 0.21)
          .view({kGlobal, 3});
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::cerr << "usage: embed_rank OUT STEPS DIE_RANK DIE_STEP [JOIN_STEP]\n";
    return 2;
  }
  // Before step JOIN_STEP the running ranks wait until a process has asked
  // to join (the store's elastic/join/count, runtime/membership.hpp), so
  // that the next commit takes it in whatever the machine's speed.
  const int64_t join_step = argc == 6 ? std::stoll(argv[5]) : -1;
  const std::string out = argv[1];
  const int64_t steps = std::stoll(argv[2]);
  const int die_rank = std::stoi(argv[3]);
  const int64_t die_step = std::stoll(argv[4]);
  try {
    torch::manual_seed(0);
    distopt::Runtime rt = distopt::Runtime::from_env();
    // The rank the launcher gave this process (a joining one is renumbered).
    const char* env_rank = std::getenv("DISTOPT_RANK");
    const int first_rank = env_rank ? std::atoi(env_rank) : rt.rank();
    torch::nn::Linear model(4, 3);
    distopt::DistributedOptimizer opt = rt.make_optimizer(*model);
    distopt::Elastic elastic(rt, *model, opt);
    int64_t step = 0, exit_at = -1;
    const char* restarted = std::getenv("DISTOPT_RESTART_COUNT");
    const char* exit_after = std::getenv("EMBED_EXIT_AFTER_JOIN");
    if (elastic.rejoined()) {  // a restarted rank: taken in at the others' commit
      step = std::stoll(elastic.position().at("step"));
      std::cout << "rank " << first_rank << " rejoined as rank " << rt.rank() << " of "
                << rt.world_size() << " at step " << step << std::endl;
      if (exit_after) exit_at = step + std::stoll(exit_after);
    } else {
      elastic.commit({{"step", "0"}});
    }
    while (step < steps) {
      try {
        if (!restarted && first_rank == die_rank && step + 1 == die_step) {
          std::cerr << "rank " << first_rank << " exits before step " << die_step << std::endl;
          // Dies in the step, after its commit's bytes reached the buddy.
          if (elastic.flush(5.0)) std::this_thread::sleep_for(std::chrono::seconds(1));
          _exit(137);
        }
        if (step == exit_at) {
          std::cerr << "joined rank exits at step " << step << std::endl;
          _exit(137);
        }
        if (step == join_step && !elastic.rejoined())
          for (int i = 0; i < 2400 && rt.store().add("elastic/join/count", 0) < 1; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const int64_t w = rt.world_size(), r = rt.rank();
        const int64_t lo = kGlobal * r / w, hi = kGlobal * (r + 1) / w;
        auto [x, y] = batch(step);
        opt.zero_grad();
        // This rank's mean loss weighted by its share: the ranks' mean
        // gradient is the global batch's.
        auto loss = torch::mse_loss(model->forward(x.slice(0, lo, hi)), y.slice(0, lo, hi)) *
                    (static_cast<double>((hi - lo) * w) / kGlobal);
        loss.backward();
        opt.step();
        ++step;
        elastic.maybe_commit({{"step", std::to_string(step)}});
      } catch (const std::exception& e) {
        if (!distopt::is_peer_failure(e)) throw;
        distopt::Elastic::Recovery rec = elastic.recover();
        step = std::stoll(rec.position.at("step"));
        std::cout << "rank " << first_rank << " is rank " << rec.rank << " of " << rec.world_size
                  << " in generation " << rec.generation << ", back at step " << step << std::endl;
      }
    }
    {  // every rank's parameters: OUT.<rank at the end>
      const std::string file = out + "." + std::to_string(rt.rank());
      FILE* f = std::fopen(file.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + file);
      for (const auto& p : model->parameters()) {
        auto flat = p.detach().reshape({-1});
        for (int64_t i = 0; i < flat.numel(); ++i)
          std::fprintf(f, "%.9g\n", flat[i].item<double>());
      }
      std::fclose(f);
    }
    std::cout << "rank " << first_rank << " done at step " << step << " as rank " << rt.rank()
              << " of " << rt.world_size() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "embed_rank: " << e.what() << std::endl;
    return 1;
  }
}
