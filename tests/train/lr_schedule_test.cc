#include "frontend/autodiff/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::autodiff {
namespace {

using ::testing::HasSubstr;

TEST(LrSchedule, ConstantWithoutWarmup) {
  LrSchedule s = *MakeLrSchedule(LrScheduleKind::kConstant, 0.1, 0, 10);
  for (int k = 0; k < 10; ++k) EXPECT_EQ(s.At(k), 0.1);
}

TEST(LrSchedule, WarmupThenConstant) {
  LrSchedule s = *MakeLrSchedule(LrScheduleKind::kConstant, 1.0, 4, 10);
  EXPECT_DOUBLE_EQ(s.At(0), 0.25);
  EXPECT_DOUBLE_EQ(s.At(1), 0.5);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(9), 1.0);
}

TEST(LrSchedule, WarmupThenCosineDecay) {
  // W = 2, N = 6: decay over 4 steps, p = 0, 1/4, 2/4, 3/4.
  LrSchedule s = *MakeLrSchedule(LrScheduleKind::kCosine, 2.0, 2, 6);
  EXPECT_DOUBLE_EQ(s.At(0), 1.0);
  EXPECT_DOUBLE_EQ(s.At(1), 2.0);
  EXPECT_DOUBLE_EQ(s.At(2), 2.0);
  EXPECT_NEAR(s.At(3), 1.0 + std::cos(std::numbers::pi / 4), 1e-15);
  EXPECT_NEAR(s.At(4), 1.0, 1e-15);
  EXPECT_NEAR(s.At(5), 1.0 + std::cos(3 * std::numbers::pi / 4), 1e-15);
  EXPECT_NEAR(s.At(6), 0.0, 1e-15);
  EXPECT_NEAR(s.At(100), 0.0, 1e-15);  // past the end: stays at 0
}

TEST(LrSchedule, LinearDecayWithoutWarmup) {
  LrSchedule s = *MakeLrSchedule(LrScheduleKind::kLinear, 1.0, 0, 4);
  EXPECT_DOUBLE_EQ(s.At(0), 1.0);
  EXPECT_DOUBLE_EQ(s.At(1), 0.75);
  EXPECT_DOUBLE_EQ(s.At(3), 0.25);
}

TEST(LrSchedule, RejectsBadArguments) {
  EXPECT_THAT(MakeLrSchedule(LrScheduleKind::kLinear, 0.0, 0, 4).status().message(),
              HasSubstr("learning rate"));
  EXPECT_THAT(MakeLrSchedule(LrScheduleKind::kLinear, 0.1, 5, 4).status().message(),
              HasSubstr("warm-up"));
  EXPECT_THAT(MakeLrSchedule(LrScheduleKind::kLinear, 0.1, 0, 0).status().message(),
              HasSubstr("steps"));
  EXPECT_THAT(ParseLrScheduleKind("step").status().message(), HasSubstr("constant, cosine or linear"));
  EXPECT_EQ(*ParseLrScheduleKind("cosine"), LrScheduleKind::kCosine);
}

}  // namespace
}  // namespace onnxpipe::autodiff
