// What the gateway's command lines need besides the server (actors/gateway.hpp): the API key file and
// whether a port can be listened on before anything is loaded.
#include "actors/gateway.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace troupe::actors {

result<std::vector<std::string>, std::string> read_api_keys(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return unexpected("cannot read the API key file " + file.string());
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    std::size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    keys.push_back(line.substr(b));
  }
  if (keys.empty()) return unexpected("the API key file " + file.string() + " holds no key");
  return keys;
}

result<void, std::string> port_available(const std::string& host, int port) {
  if (port == 0) return {};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return unexpected("cannot resolve the address " + host);
  std::string why;
  const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);
  } else {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (!why.empty()) return unexpected("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  return {};
}

}  // namespace troupe::actors
