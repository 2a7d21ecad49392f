// The tools' log options (src/common/log_format.cc): level names and one JSON object per line.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/log_format.h"

namespace kvtier {
namespace {

TEST(LogFormatTest, JsonLinesParseAndCarryTheMessageEscaped) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "kvtier", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  auto before = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  ASSERT_TRUE(ConfigureLogging("debug", /*json=*/true).ok());
  spdlog::debug("tenant \"a\\b\"\n\tsaid {}", 42);
  spdlog::trace("below the level");
  logger->flush();
  spdlog::set_default_logger(before);
  spdlog::set_level(spdlog::level::info);
  const std::string text = out.str();
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["level"], "debug");
  EXPECT_EQ(j["logger"], "kvtier");
  EXPECT_EQ(j["msg"], "tenant \"a\\b\"\n\tsaid 42");
  EXPECT_GT(j["pid"].get<int>(), 0);
  EXPECT_EQ(j["time"].get<std::string>().size(), std::string("2026-12-06T02:10:40.123456Z").size());
}

TEST(LogFormatTest, UnknownLevelIsRefusedNamingIt) {
  Status st = ConfigureLogging("verbose", false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'verbose'"), std::string::npos);
  EXPECT_TRUE(ConfigureLogging("warn", false).ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  EXPECT_TRUE(ConfigureLogging("", false).ok());  // keeps it
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  spdlog::set_level(spdlog::level::info);
}

}  // namespace
}  // namespace kvtier
