/*
 * tls.c — the --ssl-* flags and OpenSSL contexts made from them (see tls.h).
 *
 * Every file is opened first with pd_file_open_regular, so a missing or unreadable path gets the
 * system's words ("No such file or directory") instead of OpenSSL's "system lib"; what OpenSSL
 * then refuses is reported with the reason of the first error it queued ("no start line" for a
 * file that is no PEM, "key values mismatch" for a key of another certificate). OpenSSL's error
 * codes are read in ssl_reason only. No key password is ever asked for: an encrypted key is
 * refused, not prompted for on a terminal.
 */
#include "common/base/tls.h"

#include "common/base/alloc.h"
#include "common/base/file.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/base/status.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <unistd.h>

void pd_tls_flags_register(struct pd_flagset *fs, struct pd_tls_flags *t, const char *cert_help,
                           const char *ca_help) {
    pd_flag_string(fs, "--ssl-certfile", &t->certfile, "PATH", cert_help);
    pd_flag_string(fs, "--ssl-keyfile", &t->keyfile, "PATH",
                   "PEM private key of --ssl-certfile (not encrypted); one of the two without "
                   "the other refuses to start");
    if (ca_help)
        pd_flag_string(fs, "--ssl-ca-certs", &t->ca_certs, "PATH", ca_help);
}

int pd_tls_flags_check(const struct pd_tls_flags *t) {
    bool cert = t->certfile && *t->certfile, key = t->keyfile && *t->keyfile;
    if (cert && !key)
        return pd_errorf(PD_EINVAL,
                         "--ssl-certfile %s needs --ssl-keyfile (the certificate's "
                         "private key) to serve TLS",
                         t->certfile);
    if (key && !cert)
        return pd_errorf(PD_EINVAL,
                         "--ssl-keyfile %s needs --ssl-certfile (its certificate "
                         "chain) to serve TLS",
                         t->keyfile);
    return PD_OK;
}

bool pd_tls_flags_serving(const struct pd_tls_flags *t) {
    return t->certfile && *t->certfile && t->keyfile && *t->keyfile;
}

/* OpenSSL's reason for its first queued error, into buf; the queue is cleared. */
static const char *ssl_reason(char *buf, size_t n) {
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(buf, n, "%s", r);
    else if (e)
        ERR_error_string_n(e, buf, n);
    else
        snprintf(buf, n, "unknown OpenSSL error");
    ERR_clear_error();
    return buf;
}

/* The path opens as a regular file (the message names flag and path when not). */
static int check_readable(const char *flag, const char *path) {
    int fd;
    int rc = pd_file_open_regular(path, &fd, NULL);
    if (rc)
        return pd_error_wrap(rc, "%s", flag);
    close(fd);
    return PD_OK;
}

static int no_password(char *buf, int size, int rwflag, void *ud) {
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)ud;
    return -1; /* an encrypted key fails to load instead of prompting on the terminal */
}

/* A warning when the leaf certificate is outside its validity period: clients will refuse it,
 * but the server itself still starts (the clock may be what is wrong). */
static void warn_validity(SSL_CTX *ctx, const char *certfile) {
    X509 *cert = SSL_CTX_get0_certificate(ctx);
    if (!cert)
        return;
    if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0)
        pd_warn("--ssl-certfile %s: the certificate has expired; clients will refuse it", certfile);
    else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0)
        pd_warn("--ssl-certfile %s: the certificate is not valid yet; clients will refuse it",
                certfile);
}

int pd_tls_server_ctx_new(const char *certfile, const char *keyfile, struct ssl_ctx_st **out) {
    char why[256];
    int rc;
    *out = NULL;
    if ((rc = check_readable("--ssl-certfile", certfile)) ||
        (rc = check_readable("--ssl-keyfile", keyfile)))
        return rc;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return pd_errorf(PD_ENOMEM, "creating a TLS context: %s", ssl_reason(why, sizeof(why)));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* no compression (CRIME), no renegotiation (h2o cannot write while it reads) */
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(ctx, certfile) != 1) {
        rc = pd_errorf(PD_EFORMAT, "--ssl-certfile %s: not a usable PEM certificate chain (%s)",
                       certfile, ssl_reason(why, sizeof(why)));
        goto fail;
    }
    /* read first, then installed: a file that holds no key and a key of another certificate
     * get their own messages */
    BIO *bio = BIO_new_file(keyfile, "r");
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_password, NULL) : NULL;
    BIO_free(bio);
    if (!key) {
        rc = pd_errorf(PD_EFORMAT,
                       "--ssl-keyfile %s: not a usable PEM private key (%s; encrypted keys are "
                       "not supported)",
                       keyfile, ssl_reason(why, sizeof(why)));
        goto fail;
    }
    int used = SSL_CTX_use_PrivateKey(ctx, key);
    EVP_PKEY_free(key);
    if (used != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        rc = pd_errorf(PD_EMISMATCH,
                       "--ssl-keyfile %s is not the private key of the certificate in "
                       "--ssl-certfile %s (%s)",
                       keyfile, certfile, ssl_reason(why, sizeof(why)));
        goto fail;
    }
    warn_validity(ctx, certfile);
    *out = ctx;
    return PD_OK;
fail:
    SSL_CTX_free(ctx);
    return rc;
}

void pd_tls_ctx_free(struct ssl_ctx_st *ctx) {
    SSL_CTX_free(ctx);
}

int pd_tls_ca_check(const char *path) {
    char why[256];
    int rc = check_readable("--ssl-ca-certs", path);
    if (rc)
        return rc;
    ERR_clear_error();
    X509_STORE *st = X509_STORE_new();
    if (!st)
        return pd_errorf(PD_ENOMEM, "--ssl-ca-certs %s: %s", path, ssl_reason(why, sizeof(why)));
    if (X509_STORE_load_file(st, path) != 1) {
        rc = pd_errorf(PD_EFORMAT, "--ssl-ca-certs %s: no usable PEM CA certificate (%s)", path,
                       ssl_reason(why, sizeof(why)));
        X509_STORE_free(st);
        return rc;
    }
    X509_STORE_free(st);
    return PD_OK;
}

int pd_tls_pem_read(const char *flag, const char *path, char **out) {
    size_t len;
    int rc = pd_file_read_all(path, out, &len);
    if (rc)
        return pd_error_wrap(rc, "%s", flag);
    return PD_OK;
}
