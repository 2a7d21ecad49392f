// Subcommand registry of the kvtier CLI. Each subcommand lives in its own file and registers
// itself at static-initialisation time:
//
//   KVTIER_REGISTER_COMMAND(bench_host, ({"bench", "host"}), "Host tier GB/s beside memcpy",
//                           [](CLI::App* app) -> kvtier::cli::RunFn { ...; return [=] { ... }; });
//
// A path of several words nests the subcommand ("kvtier bench host"); intermediate commands are
// created on demand. The returned RunFn runs when that subcommand is chosen; its int is the exit
// code (0 ok, 1 failure, 2 bad usage).
#ifndef KVTIER_TOOLS_COMMAND_H_
#define KVTIER_TOOLS_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace kvtier::cli {

using RunFn = std::function<int()>;
using SetupFn = std::function<RunFn(CLI::App*)>;

struct CommandSpec {
  std::vector<std::string> path;
  std::string description;
  SetupFn setup;
};

bool RegisterCommand(CommandSpec spec);
std::vector<CommandSpec>& Commands();

// Progress on stderr for long work: prints at most every 0.5 s, and only after the first second,
// and only when stderr is a terminal or KVTIER_PROGRESS=1.
class Progress {
 public:
  explicit Progress(std::string label);
  ~Progress();
  void Update(double done, double total);

 private:
  std::string label_;
  double start_s_;
  double last_s_ = 0;
  bool enabled_;
  bool printed_ = false;
};

}  // namespace kvtier::cli

#define KVTIER_REGISTER_COMMAND(id, path, description, setup)             \
  static const bool kvtier_command_##id = ::kvtier::cli::RegisterCommand( \
      ::kvtier::cli::CommandSpec{std::vector<std::string> path, description, setup})

#endif  // KVTIER_TOOLS_COMMAND_H_
