// kvtier: the command-line tool. Subcommands register themselves (command.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "command.h"

namespace kvtier::cli {

std::vector<CommandSpec>& Commands() {
  static std::vector<CommandSpec> commands;
  return commands;
}

bool RegisterCommand(CommandSpec spec) {
  Commands().push_back(std::move(spec));
  return true;
}

static double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Progress::Progress(std::string label) : label_(std::move(label)), start_s_(NowS()) {
  const char* env = std::getenv("KVTIER_PROGRESS");
  enabled_ = env ? std::string(env) == "1" : isatty(STDERR_FILENO) != 0;
}

Progress::~Progress() {
  if (printed_) std::fprintf(stderr, "\n");
}

void Progress::Update(double done, double total) {
  if (!enabled_) return;
  double now = NowS();
  if (now - start_s_ < 1.0 || now - last_s_ < 0.5) return;
  last_s_ = now;
  double frac = total > 0 ? done / total : 0;
  double eta = frac > 0 ? (now - start_s_) * (1 - frac) / frac : 0;
  std::fprintf(stderr, "\r%s: %5.1f%%  %.0fs elapsed, ~%.0fs left   ", label_.c_str(), 100 * frac,
               now - start_s_, eta);
  std::fflush(stderr);
  printed_ = true;
}

}  // namespace kvtier::cli

int main(int argc, char** argv) {
  using kvtier::cli::Commands;
  // Logs go to stderr: stdout carries results (--json, CSV) that other programs parse.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvtier"));
  CLI::App app{
      "kvtier: KV-cache offload for LLM inference - host DRAM, SSD and shared remote tiers.\n"
      "Run 'kvtier COMMAND --help' for a command's options."};
  app.require_subcommand(1);
  app.set_version_flag("--version", KVTIER_VERSION);

  std::map<std::string, CLI::App*> nodes;  // "bench" -> its App
  kvtier::cli::RunFn chosen;
  int exit_code = 0;
  for (auto& spec : Commands()) {
    CLI::App* parent = &app;
    std::string key;
    for (size_t i = 0; i + 1 < spec.path.size(); ++i) {
      key += "/" + spec.path[i];
      auto it = nodes.find(key);
      if (it == nodes.end()) {
        CLI::App* sub = parent->add_subcommand(spec.path[i], spec.path[i] + " commands");
        sub->require_subcommand(1);
        it = nodes.emplace(key, sub).first;
      }
      parent = it->second;
    }
    CLI::App* sub = parent->add_subcommand(spec.path.back(), spec.description);
    auto run = std::make_shared<kvtier::cli::RunFn>(spec.setup(sub));
    sub->callback([run, &chosen] { chosen = *run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // "A subcommand is required" for a mistyped command would hide the typo: name it.
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::vector<std::string> rest = app.remaining(true);
      if (!rest.empty()) {
        std::string parent = "kvtier";
        for (CLI::App* sub = &app; !sub->get_subcommands().empty();) {
          sub = sub->get_subcommands().front();
          parent += " " + sub->get_name();
        }
        std::fprintf(stderr, "%s: unknown command '%s'; see '%s --help'\n", parent.c_str(),
                     rest.front().c_str(), parent.c_str());
        return 2;
      }
    }
    return app.exit(e);
  }
  if (!chosen) return exit_code;
  try {
    exit_code = chosen();
  } catch (const std::bad_alloc&) {
    // Not an abort (exit 134) with a bare "terminate called": say what ran out.
    std::fprintf(stderr,
                 "kvtier: out of memory (std::bad_alloc): this run needs more memory than the "
                 "process may use (see ulimit -v and the machine's free memory)\n");
    return 1;
  }
  return exit_code;
}
