// kvtier version: the tool's version and build features.
#include <cstdio>

#include "command.h"

KVTIER_REGISTER_COMMAND(version, ({"version"}), "Print the version and build features",
                        [](CLI::App*) -> kvtier::cli::RunFn {
                          return [] {
#ifdef KVTIER_HAVE_CUDA
                            const char* cuda = "yes";
#else
                            const char* cuda = "no";
#endif
                            std::printf("kvtier %s (cuda: %s)\n", KVTIER_VERSION, cuda);
                            return 0;
                          };
                        });
