#include "common/log_format.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>

namespace kvtier {
namespace {

void AppendEscaped(std::string_view s, spdlog::memory_buf_t* out) {
  for (char ch : s) {
    switch (ch) {
      case '"':
        out->append(std::string_view("\\\""));
        break;
      case '\\':
        out->append(std::string_view("\\\\"));
        break;
      case '\n':
        out->append(std::string_view("\\n"));
        break;
      case '\r':
        out->append(std::string_view("\\r"));
        break;
      case '\t':
        out->append(std::string_view("\\t"));
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          fmt::format_to(std::back_inserter(*out), "\\u{:04x}", static_cast<unsigned>(ch));
        } else {
          out->push_back(ch);
        }
    }
  }
}

// One JSON object per record; bytes of the message that are not UTF-8 pass through as they are.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since = msg.time.time_since_epoch();
    const std::time_t secs =
        static_cast<std::time_t>(std::chrono::duration_cast<std::chrono::seconds>(since).count());
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(since).count() % 1000000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char when[32];
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    fmt::format_to(std::back_inserter(dest),
                   "{{\"time\":\"{}.{:06d}Z\",\"level\":\"{}\",\"logger\":\"", when,
                   static_cast<int>(micros), std::string_view(level.data(), level.size()));
    AppendEscaped(std::string_view(msg.logger_name.data(), msg.logger_name.size()), &dest);
    fmt::format_to(std::back_inserter(dest), "\",\"pid\":{},\"thread\":{},\"msg\":\"", pid_,
                   msg.thread_id);
    AppendEscaped(std::string_view(msg.payload.data(), msg.payload.size()), &dest);
    dest.append(std::string_view("\"}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }

 private:
  const int pid_ = static_cast<int>(::getpid());
};

}  // namespace

Status ConfigureLogging(std::string_view level, bool json) {
  if (!level.empty()) {
    // from_str takes any word it does not know for "off": check the names first.
    bool known = false;
    for (std::string_view name :
         {"trace", "debug", "info", "warn", "warning", "error", "critical", "off"})
      known |= level == name;
    if (!known)
      return Status::InvalidArgument("log level '" + std::string(level) +
                                     "': want trace, debug, info, warn, error, critical or off");
    spdlog::set_level(spdlog::level::from_str(std::string(level)));
  }
  if (json) spdlog::set_formatter(std::make_unique<JsonFormatter>());
  return Status::Ok();
}

}  // namespace kvtier
