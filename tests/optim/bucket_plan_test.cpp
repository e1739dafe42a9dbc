// Bucket planning: reverse order, cap, alignment, one dtype per bucket.
#include "optim/bucket_plan.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using distopt::optim::plan_buckets;
using distopt::optim::PlanInput;

TEST_CASE("buckets take parameters in reverse registration order") {
  std::vector<PlanInput> in = {{10, 4, 0}, {20, 4, 0}, {30, 4, 0}};
  auto plan = plan_buckets(in, 1e9, 4);
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].entries.size() == 3);
  CHECK(plan[0].entries[0].param == 2);
  CHECK(plan[0].entries[1].param == 1);
  CHECK(plan[0].entries[2].param == 0);
  CHECK(plan[0].entries[0].offset == 0);
  CHECK(plan[0].entries[1].offset == 30);
  CHECK(plan[0].entries[2].offset == 50);
  CHECK(plan[0].length == 60);
}

TEST_CASE("bucket cap closes a bucket before it would overflow") {
  // 100 floats = 400 bytes each; cap 1000 bytes fits two.
  std::vector<PlanInput> in(5, PlanInput{100, 4, 0});
  auto plan = plan_buckets(in, 1000, 4);
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].entries.size() == 2);
  CHECK(plan[1].entries.size() == 2);
  CHECK(plan[2].entries.size() == 1);
  CHECK(plan[0].entries[0].param == 4);
  CHECK(plan[2].entries[0].param == 0);
  for (const auto& b : plan) CHECK(b.bytes() <= 1000);
}

TEST_CASE("an entry larger than the cap gets a bucket of its own") {
  std::vector<PlanInput> in = {{10, 4, 0}, {1000, 4, 0}, {10, 4, 0}};
  auto plan = plan_buckets(in, 100, 4);
  REQUIRE(plan.size() == 3);
  CHECK(plan[1].entries.size() == 1);
  CHECK(plan[1].entries[0].param == 1);
  CHECK(plan[1].length == 1000);
}

TEST_CASE("entries are aligned to align_bytes and the length is padded") {
  std::vector<PlanInput> in = {{3, 4, 0}, {5, 4, 0}, {1, 4, 0}};
  auto plan = plan_buckets(in, 1e9, 64);  // 16 floats
  REQUIRE(plan.size() == 1);
  const auto& e = plan[0].entries;
  CHECK(e[0].offset == 0);   // param 2, 1 float
  CHECK(e[1].offset == 16);  // param 1, 5 floats
  CHECK(e[2].offset == 32);  // param 0, 3 floats
  CHECK(plan[0].length == 48);
  for (const auto& x : e) CHECK((x.offset * 4) % 64 == 0);
}

TEST_CASE("alignment smaller than the element size keeps elements whole") {
  std::vector<PlanInput> in = {{3, 8, 1}, {3, 8, 1}};
  auto plan = plan_buckets(in, 1e9, 4);  // lcm(4, 8) = 8 bytes = 1 double
  REQUIRE(plan.size() == 1);
  CHECK(plan[0].entries[1].offset == 3);
  CHECK(plan[0].length == 6);
}

TEST_CASE("alignment counts against the cap") {
  // Two 1-float entries with 64-byte alignment need 68 bytes: cap 64 splits them.
  std::vector<PlanInput> in = {{1, 4, 0}, {1, 4, 0}};
  CHECK(plan_buckets(in, 64, 64).size() == 2);
  CHECK(plan_buckets(in, 68, 64).size() == 1);
}

TEST_CASE("one dtype per bucket, buckets ordered by their first entry") {
  // registration: f32, f64, f32, f64 -> reverse: f64(3), f32(2), f64(1), f32(0)
  std::vector<PlanInput> in = {{4, 4, 0}, {4, 8, 1}, {4, 4, 0}, {4, 8, 1}};
  auto plan = plan_buckets(in, 1e9, 8);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].dtype == 1);
  CHECK(plan[0].element_size == 8);
  CHECK(plan[0].entries[0].param == 3);
  CHECK(plan[0].entries[1].param == 1);
  CHECK(plan[1].dtype == 0);
  CHECK(plan[1].entries[0].param == 2);
  CHECK(plan[1].entries[1].param == 0);
}

TEST_CASE("planning rejects bad input") {
  CHECK_THROWS_AS(plan_buckets({{1, 4, 0}}, 100, 0), std::invalid_argument);
  CHECK_THROWS_AS(plan_buckets({{1, 0, 0}}, 100, 4), std::invalid_argument);
  CHECK(plan_buckets({}, 100, 4).empty());
}
