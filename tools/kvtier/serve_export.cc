#include "serve_export.h"

#include <httplib.h>

#include <thread>

namespace kvtier::cli {

class MetricsServer::Impl {
 public:
  httplib::Server http;
  std::thread thread;
  int port = 0;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& addr,
                                                            std::function<std::string()> text) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos)
    return Status::InvalidArgument("metrics address '" + addr + "': want HOST:PORT");
  const std::string host = addr.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(addr.substr(colon + 1));
  } catch (...) {
    return Status::InvalidArgument("metrics address '" + addr + "': bad port");
  }
  // httplib takes the port as an int and binds it modulo 65536 (99999 became 34463).
  if (port < 0 || port > 65535)
    return Status::InvalidArgument("metrics address '" + addr + "': port out of 0..65535");
  auto impl = std::make_unique<Impl>();
  impl->http.Get("/metrics", [text](const httplib::Request&, httplib::Response& res) {
    res.set_content(text(), "text/plain; version=0.0.4");
  });
  impl->port = port == 0 ? impl->http.bind_to_any_port(host.c_str())
                         : (impl->http.bind_to_port(host.c_str(), port) ? port : -1);
  if (impl->port <= 0) return Status::Unavailable("metrics address '" + addr + "': cannot bind");
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->http.listen_after_bind(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}
int MetricsServer::port() const { return impl_->port; }

}  // namespace kvtier::cli
