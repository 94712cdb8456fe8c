/*
 * tls.h — TLS settings of pdserve's processes: the --ssl-certfile / --ssl-keyfile / --ssl-ca-certs
 * flags (SGLang's and vLLM's names) and the OpenSSL objects made from them.
 *
 * A process serves TLS when it has both a certificate and a key (one without the other refuses
 * to start). pd_tls_server_ctx_new reads and checks them once, at start, with errors that name
 * the flag and the file, so a wrong path fails before a model loads; the HTTP server
 * (http_server.h) takes the context, the gRPC bootstrap server the PEM text (pd_tls_pem_read).
 * --ssl-ca-certs is what a process checks the TLS peers it calls against (the router its
 * https:// workers, decode the prefill's bootstrap port); without it, the system's roots.
 * Nothing here keeps state between calls; OpenSSL's error queue is cleared after each failure.
 */
#ifndef PD_TLS_H
#define PD_TLS_H

#include <stdbool.h>
#include <stddef.h>

struct pd_flagset;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

struct pd_tls_flags {
    const char *certfile; /* --ssl-certfile: PEM certificate chain, this process's first */
    const char *keyfile;  /* --ssl-keyfile: PEM private key of that certificate */
    const char *ca_certs; /* --ssl-ca-certs: PEM CA bundle the peers called must chain to */
};

/* Registers --ssl-certfile (cert_help: what serving TLS covers in this binary), --ssl-keyfile
 * and, when ca_help is not NULL, --ssl-ca-certs. */
void pd_tls_flags_register(struct pd_flagset *fs, struct pd_tls_flags *t, const char *cert_help,
                           const char *ca_help);
/* After parsing: PD_EINVAL when only one of --ssl-certfile and --ssl-keyfile is given. */
int pd_tls_flags_check(const struct pd_tls_flags *t);
/* Both a certificate and a key: this process serves TLS. */
bool pd_tls_flags_serving(const struct pd_tls_flags *t);

/* A server context: TLS 1.2 or newer, the certificate chain of certfile and the key of keyfile,
 * checked against each other. The caller frees it with pd_tls_ctx_free (the HTTP server keeps a
 * reference of its own). Errors name the flag, the file and what is wrong with it. */
int pd_tls_server_ctx_new(const char *certfile, const char *keyfile, struct ssl_ctx_st **out);
void pd_tls_ctx_free(struct ssl_ctx_st *ctx); /* NULL is fine */

/* Checks that --ssl-ca-certs path holds at least one PEM certificate OpenSSL can use. */
int pd_tls_ca_check(const char *path);

/* The whole file (PEM text, NUL-terminated; caller pd_frees) for gRPC's credentials; flag names
 * the file's flag in the error. */
int pd_tls_pem_read(const char *flag, const char *path, char **out);

#endif
