// What `kvtier serve` exports besides its socket and KV events (those are the library's,
// src/events): GET /metrics in the Prometheus text format (cpp-httplib). It lives in the CLI,
// not the library, so libkvtier's users do not inherit an HTTP server.
//
// Thread-safety: MetricsServer runs one thread of its own.
#ifndef KVTIER_TOOLS_SERVE_EXPORT_H_
#define KVTIER_TOOLS_SERVE_EXPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "kvtier/status.h"

namespace kvtier::cli {

class MetricsServer {
 public:
  // Serves GET /metrics on addr ("HOST:PORT"; port 0 = any free one) with text().
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& addr,
                                                      std::function<std::string()> text);
  ~MetricsServer();
  int port() const;
  class Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_SERVE_EXPORT_H_
