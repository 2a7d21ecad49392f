// kvtier version: the tool's version and build features.
#include <cstdio>

#include "command.h"

namespace {
#ifdef KVTIER_HAVE_CUDA
constexpr const char* kCuda = "yes";
#else
constexpr const char* kCuda = "no";
#endif
}  // namespace

KVTIER_REGISTER_COMMAND(version, ({"version"}), "Print the version and build features",
                        [](CLI::App*) -> kvtier::cli::RunFn {
                          return [] {
                            std::printf("kvtier %s (cuda: %s)\n", KVTIER_VERSION, kCuda);
                            return 0;
                          };
                        });
