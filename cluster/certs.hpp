#pragma once
// `troupe certs`: the cluster's certificate authority and the certificates of its processes, made
// with OpenSSL (no openssl command line needed). Keys are EC P-256, written 0600; certificates are
// X.509 v3: the CA with basicConstraints CA:TRUE (keyCertSign, cRLSign), each process's with CA:FALSE,
// digitalSignature and both serverAuth and clientAuth (a node dials, the coordinator listens, either
// side proves itself), its name as the subject's common name and as a DNS subjectAltName.
#include <filesystem>
#include <string>

#include "engine/core/result.hpp"

namespace troupe::cluster {

struct issued {
  std::filesystem::path certificate, key;
};

// Makes DIR/ca.pem and DIR/ca.key (refuses to overwrite either). `days`: validity.
result<issued, std::string> init_ca(const std::filesystem::path& dir, const std::string& name = "troupe-ca", int days = 3650);
// Makes DIR/NAME.pem and DIR/NAME.key signed by DIR/ca.pem and DIR/ca.key (refuses to overwrite, and
// refuses a name that is not 1-64 of [A-Za-z0-9._-]).
result<issued, std::string> issue(const std::filesystem::path& dir, const std::string& name, int days = 825);

}  // namespace troupe::cluster
