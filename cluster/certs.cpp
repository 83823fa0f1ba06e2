// `troupe certs` (cluster/certs.hpp) with OpenSSL 3's EVP and X509 APIs.
#include "cluster/certs.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <memory>

namespace troupe::cluster {
namespace {

namespace fs = std::filesystem;

struct key_free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct cert_free {
  void operator()(X509* c) const { X509_free(c); }
};
using key_ptr = std::unique_ptr<EVP_PKEY, key_free>;
using cert_ptr = std::unique_ptr<X509, cert_free>;

std::string reason() {
  const unsigned long e = ERR_get_error();
  if (!e) return "no reason given";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

bool good_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return n != "ca" && n.front() != '.';
}

result<void, std::string> write_key(const fs::path& p, EVP_PKEY* k) {
  const mode_t old = ::umask(077);
  FILE* f = std::fopen(p.c_str(), "wx");
  ::umask(old);
  if (!f) return unexpected("cannot create " + p.string() + " (it may exist already)");
  const bool ok = PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  if (!ok) return unexpected("cannot write " + p.string() + ": " + reason());
  return {};
}

result<void, std::string> write_cert(const fs::path& p, X509* c) {
  FILE* f = std::fopen(p.c_str(), "wx");
  if (!f) return unexpected("cannot create " + p.string() + " (it may exist already)");
  const bool ok = PEM_write_X509(f, c) == 1;
  std::fclose(f);
  if (!ok) return unexpected("cannot write " + p.string() + ": " + reason());
  return {};
}

result<void, std::string> add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) return unexpected(std::string("cannot make the extension ") + value + ": " + reason());
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  if (!ok) return unexpected(std::string("cannot add the extension ") + value);
  return {};
}

// A certificate for `subject_cn` over `key`, valid `days`, with a random 128-bit serial.
result<cert_ptr, std::string> new_cert(const std::string& subject_cn, EVP_PKEY* key, int days) {
  cert_ptr c(X509_new());
  if (!c) return unexpected(reason());
  X509_set_version(c.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(c.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -300);
  X509_gmtime_adj(X509_getm_notAfter(c.get()), static_cast<long>(days) * 24 * 3600);
  X509_set_pubkey(c.get(), key);
  X509_NAME* n = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(n, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("troupe"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(subject_cn.c_str()), -1, -1, 0);
  return c;
}

result<key_ptr, std::string> read_key(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  if (!f) return unexpected("cannot read " + p.string() + " (make the CA first: troupe certs init)");
  key_ptr k(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!k) return unexpected(p.string() + " is not a PEM private key: " + reason());
  return k;
}

result<cert_ptr, std::string> read_cert(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  if (!f) return unexpected("cannot read " + p.string() + " (make the CA first: troupe certs init)");
  cert_ptr c(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!c) return unexpected(p.string() + " is not a PEM certificate: " + reason());
  return c;
}

}  // namespace

result<issued, std::string> init_ca(const fs::path& dir, const std::string& name, int days) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const issued out{dir / "ca.pem", dir / "ca.key"};
  if (fs::exists(out.certificate) || fs::exists(out.key)) return unexpected(dir.string() + " has a CA already (ca.pem / ca.key); not overwritten");
  key_ptr key(EVP_EC_gen("P-256"));
  if (!key) return unexpected("cannot make a key: " + reason());
  auto c = new_cert(name, key.get(), days);
  if (!c) return unexpected(c.error());
  X509_set_issuer_name(c->get(), X509_get_subject_name(c->get()));
  for (auto [nid, v] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"}, std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                        std::pair{NID_subject_key_identifier, "hash"}})
    if (auto r = add_ext(c->get(), c->get(), nid, v); !r) return unexpected(r.error());
  if (X509_sign(c->get(), key.get(), EVP_sha256()) == 0) return unexpected("cannot sign the CA: " + reason());
  if (auto r = write_key(out.key, key.get()); !r) return unexpected(r.error());
  if (auto r = write_cert(out.certificate, c->get()); !r) return unexpected(r.error());
  return out;
}

result<issued, std::string> issue(const fs::path& dir, const std::string& name, int days) {
  if (!good_name(name)) return unexpected("'" + name + "' is not a certificate name (1-64 of A-Z a-z 0-9 . _ -, not 'ca')");
  auto ca_key = read_key(dir / "ca.key");
  if (!ca_key) return unexpected(ca_key.error());
  auto ca = read_cert(dir / "ca.pem");
  if (!ca) return unexpected(ca.error());
  const issued out{dir / (name + ".pem"), dir / (name + ".key")};
  if (fs::exists(out.certificate) || fs::exists(out.key)) return unexpected(out.certificate.string() + " exists already; not overwritten");
  key_ptr key(EVP_EC_gen("P-256"));
  if (!key) return unexpected("cannot make a key: " + reason());
  auto c = new_cert(name, key.get(), days);
  if (!c) return unexpected(c.error());
  X509_set_issuer_name(c->get(), X509_get_subject_name(ca->get()));
  const std::string san = "DNS:" + name;
  for (auto [nid, v] : {std::pair{NID_basic_constraints, "critical,CA:FALSE"}, std::pair{NID_key_usage, "critical,digitalSignature"},
                        std::pair{NID_ext_key_usage, "serverAuth,clientAuth"}, std::pair{NID_subject_key_identifier, "hash"},
                        std::pair{NID_authority_key_identifier, "keyid"}, std::pair{NID_subject_alt_name, san.c_str()}})
    if (auto r = add_ext(c->get(), ca->get(), nid, v); !r) return unexpected(r.error());
  if (X509_sign(c->get(), ca_key->get(), EVP_sha256()) == 0) return unexpected("cannot sign: " + reason());
  if (auto r = write_key(out.key, key.get()); !r) return unexpected(r.error());
  if (auto r = write_cert(out.certificate, c->get()); !r) return unexpected(r.error());
  return out;
}

}  // namespace troupe::cluster
