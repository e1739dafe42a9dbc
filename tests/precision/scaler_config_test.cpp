// The loss scaler's update rule (torch.cuda.amp.GradScaler + apex's
// min_loss_scale) and the `precision:` section of the job YAML. Torch-free.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/precision.hpp"

using distopt::ConfigError;
using distopt::LossScaler;
using distopt::LossScaleState;
using distopt::PrecisionConfig;
using distopt::PrecisionDtype;

namespace {

PrecisionConfig dynamic_cfg(double init, int64_t interval, double min_scale = 1) {
  PrecisionConfig c;
  c.dtype = PrecisionDtype::bf16;
  c.init_scale = init;
  c.growth_interval = interval;
  c.min_scale = min_scale;
  return c;
}

// The message of the ConfigError that parsing `yaml` throws ("" if none).
std::string parse_error(const std::string& yaml) {
  try {
    distopt::parse_job_config(yaml, "job.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("dynamic loss scale backs off on inf, grows after growth_interval good steps") {
  LossScaler s(dynamic_cfg(1024, 3));
  CHECK(s.scale() == 1024);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024);  // 2 good steps < interval 3
  CHECK(s.state().growth_tracker == 2);
  s.update(true);
  CHECK(s.scale() == 512);               // x backoff_factor 0.5
  CHECK(s.state().growth_tracker == 0);  // an overflow restarts the count
  CHECK(s.skipped_steps() == 1);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 512);
  s.update(false);
  CHECK(s.scale() == 1024);  // the 3rd consecutive good step grows x2
  CHECK(s.state().growth_tracker == 0);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 2048);
  CHECK(s.skipped_steps() == 1);
}

TEST_CASE("the scale never backs off below min_scale and never grows into inf") {
  LossScaler s(dynamic_cfg(8, 2000, 2));
  s.update(true);
  CHECK(s.scale() == 4);
  s.update(true);
  CHECK(s.scale() == 2);
  s.update(true);
  CHECK(s.scale() == 2);  // 1 would be below min_scale
  CHECK(s.skipped_steps() == 3);

  PrecisionConfig c = dynamic_cfg(1e308, 1);
  c.growth_factor = 10;
  LossScaler big(c);
  big.update(false);
  CHECK(big.scale() == 1e308);  // 1e309 is inf: kept
  CHECK(std::isfinite(big.scale()));

  PrecisionConfig f = dynamic_cfg(100, 2);
  f.growth_factor = 3;
  f.backoff_factor = 0.25;
  LossScaler other(f);
  other.update(true);
  CHECK(other.scale() == 25);
  other.update(false);
  other.update(false);
  CHECK(other.scale() == 75);
}

TEST_CASE("a static loss scale never changes but still counts skipped steps") {
  PrecisionConfig c;
  c.dtype = PrecisionDtype::bf16;
  c.loss_scale_set = true;
  c.dynamic = false;
  c.static_scale = 128;
  c.growth_interval = 1;
  LossScaler s(c);
  CHECK(s.scale() == 128);
  s.update(true);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 128);
  CHECK(s.skipped_steps() == 1);
}

TEST_CASE("loss scale state round-trips and rejects invalid values") {
  LossScaler s(dynamic_cfg(1024, 2));
  LossScaleState st;
  st.scale = 256;
  st.growth_tracker = 1;
  st.skipped_steps = 7;
  s.set_state(st);
  CHECK(s.scale() == 256);
  CHECK(s.skipped_steps() == 7);
  s.update(false);  // tracker 1 -> 2 == interval: grows
  CHECK(s.scale() == 512);
  st.scale = 0;
  CHECK_THROWS_AS(s.set_state(st), distopt::Error);
  st.scale = INFINITY;
  CHECK_THROWS_AS(s.set_state(st), distopt::Error);
  st.scale = 2;
  st.growth_tracker = -1;
  CHECK_THROWS_AS(s.set_state(st), distopt::Error);
  CHECK(s.scale() == 512);  // a refused state changes nothing
}

TEST_CASE("precision: absent means fp32 and off; every key parses") {
  auto none = distopt::parse_job_config("world: {size: 1}\n");
  CHECK(none.precision.dtype == PrecisionDtype::fp32);
  CHECK_FALSE(none.precision.enabled());

  auto cfg = distopt::parse_job_config(
      "precision:\n"
      "  dtype: bf16\n"
      "  master_weights: fp32\n"
      "  loss_scale: dynamic\n"
      "  init_scale: 1024\n"
      "  growth_factor: 4\n"
      "  backoff_factor: 0.25\n"
      "  growth_interval: 50\n"
      "  min_scale: 0.5\n");
  const PrecisionConfig& p = cfg.precision;
  CHECK(p.dtype == PrecisionDtype::bf16);
  CHECK(p.enabled());
  CHECK(p.dynamic);
  CHECK(p.initial_scale() == 1024);
  CHECK(p.growth_factor == 4);
  CHECK(p.backoff_factor == 0.25);
  CHECK(p.growth_interval == 50);
  CHECK(p.min_scale == 0.5);

  auto quoted = distopt::parse_job_config("precision: {loss_scale: 'dynamic'}\n");
  CHECK(quoted.precision.dynamic);
  auto st = distopt::parse_job_config("precision: {dtype: bf16, loss_scale: 128}\n");
  CHECK_FALSE(st.precision.dynamic);
  CHECK(st.precision.initial_scale() == 128);

  auto f32 = distopt::parse_job_config("precision: {dtype: fp32}\n");
  CHECK_FALSE(f32.precision.enabled());  // fp32 without loss_scale: nothing changes
  auto f32s = distopt::parse_job_config("precision: {dtype: fp32, loss_scale: 8}\n");
  CHECK(f32s.precision.enabled());
  auto f16 = distopt::parse_job_config("precision: {dtype: fp16}\n");
  CHECK(f16.precision.dtype == PrecisionDtype::fp16);
  CHECK(std::string(distopt::precision_dtype_name(PrecisionDtype::bf16)) == "bf16");
}

TEST_CASE("bad precision YAML names file:line:col and the key") {
  struct Case {
    std::string yaml, expect;
  };
  const Case cases[] = {
      {"world: {size: 1}\nprecision:\n  dtype: int8\n",
       "job.yaml:3:10: precision.dtype: 'int8' is not one of bf16|fp16|fp32"},
      {"precision:\n  dtype: bf16\n  loss_scal: 2\n",
       "job.yaml:3:3: unknown key 'loss_scal' in precision; valid keys: dtype, master_weights, "
       "loss_scale, "
       "init_scale, growth_factor, backoff_factor, growth_interval, min_scale (did you mean "
       "'loss_scale'?)"},
      {"precision:\n  loss_scale: dynamik\n",
       "job.yaml:2:15: precision.loss_scale: expected 'dynamic' or a number > 0, got 'dynamik'"},
      {"precision:\n  loss_scale: -4\n",
       "job.yaml:2:15: precision.loss_scale: value -4 must be a finite number > 0"},
      {"precision:\n  loss_scale: \"128\"\n",  // a quoted number is a string
       "job.yaml:2:15: precision.loss_scale: expected 'dynamic' or a number > 0, got '128'"},
      {"precision:\n  master_weights: bf16\n",
       "job.yaml:2:19: precision.master_weights: 'bf16' is not one of fp32"},
      {"precision:\n  growth_factor: 1\n",
       "job.yaml:2:18: precision.growth_factor: value 1 is out of range (1, inf)"},
      {"precision:\n  backoff_factor: 1.5\n",
       "job.yaml:2:19: precision.backoff_factor: value 1.5 is out of range (0, 1)"},
      {"precision:\n  init_scale: x\n",
       "job.yaml:2:15: precision.init_scale: expected a number, got 'x'"},
      {"precision:\n  growth_interval: 0\n",
       "job.yaml:2:20: precision.growth_interval: value 0 must be >= 1"},
      {"precision:\n  growth_interval: 1.5\n",
       "job.yaml:2:20: precision.growth_interval: expected an integer, got '1.5'"},
      {"precision:\n  init_scale: 16\n  min_scale: 32\n",
       "job.yaml:3:14: precision.min_scale: 32.000000 exceeds init_scale 16.000000"},
      {"precision: bf16\n", "job.yaml:1:12: precision: expected a map, got 'bf16'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.yaml);
    std::string msg = parse_error(c.yaml);
    CHECK(msg.rfind(c.expect, 0) == 0);
    if (msg.rfind(c.expect, 0) != 0) MESSAGE("got: " << msg);
  }
}
