// format_duration: what the progress bar's ETA and the epoch lines show, worked out by hand.
#include <gtest/gtest.h>

#include <limits>

#include "train/console.hpp"

namespace ddpv {
namespace {

TEST(FormatDuration, MinutesThenHoursRoundedToTheSecond) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(0.49), "0:00");
  EXPECT_EQ(format_duration(59.5), "1:00");
  EXPECT_EQ(format_duration(125), "2:05");
  EXPECT_EQ(format_duration(3599.4), "59:59");
  EXPECT_EQ(format_duration(3599.5), "1:00:00");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600.0 + 61), "100:01:01");
}

TEST(FormatDuration, UnknownOrUnboundedIsAQuestionMark) {
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  // An ETA from a rate near zero: past a million hours, and far past what an int64 holds.
  EXPECT_EQ(format_duration(3600.0 * 1e6), "?");
  EXPECT_EQ(format_duration(1e30), "?");
  EXPECT_EQ(format_duration(3600.0 * 1e6 - 1), "999999:59:59");
}

}  // namespace
}  // namespace ddpv
