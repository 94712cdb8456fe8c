/*
 * cache_tree.h — the cache_aware policy's approximate prefix tree (sglang-router's "approximate
 * radix tree"): what the router has sent to each prefill worker, so that a request whose text
 * begins like an earlier one goes where that prefix is likely still in the worker's prefix cache
 * (common/radix_cache.c) — without asking the worker.
 *
 * One radix tree over request texts (bytes, router/route_text.h says which text), shared by all
 * workers ("tenants", small integer ids). Every node is marked with the tenants whose requests
 * passed through it and the logical time of the latest one. Marks are prefix-closed: a tenant
 * marking a node marks all its ancestors, with access times never older than the node's, so one
 * walk down the tree gives every tenant's matched length at once.
 *
 * A tenant's size is the bytes of the nodes it marks (sglang-router counts characters; bytes are
 * the same for ASCII and never undercount). pd_cache_tree_evict drops each oversized tenant's
 * least recently used leaves until it fits, as sglang-router's eviction thread does on a timer;
 * nodes no tenant marks any more are freed, so the tree holds at most the sum of its tenants'
 * sizes. Access times are a counter, not a clock: eviction order is the order of insertions.
 * Not thread-safe (the router's loop thread owns it).
 */
#ifndef PD_ROUTER_CACHE_TREE_H
#define PD_ROUTER_CACHE_TREE_H

#include <stddef.h>
#include <stdint.h>

struct pd_cache_tree;

/* PD_OK or PD_ENOMEM. */
int pd_cache_tree_new(struct pd_cache_tree **out);
void pd_cache_tree_free(struct pd_cache_tree *t);

/* A fresh tenant with nothing in the tree: the lowest free id (ids of removed tenants are
 * reused). PD_OK or PD_ENOMEM. */
int pd_cache_tree_tenant_add(struct pd_cache_tree *t, int *id);
/* Drops every mark of tenant id; nodes no one marks any more are freed; the id becomes free.
 * A worker leaving the router (DNS drained it), not one whose circuit opened. */
void pd_cache_tree_tenant_remove(struct pd_cache_tree *t, int id);
/* Ids are below this (live or free). */
int pd_cache_tree_tenant_cap(const struct pd_cache_tree *t);
/* Bytes of the nodes tenant id marks; 0 for a free id. */
size_t pd_cache_tree_tenant_size(const struct pd_cache_tree *t, int id);

/* Text s[0..len) went to tenant: every node on its path gets the tenant's mark at a fresh
 * access time (nodes split and added as needed). PD_OK, or PD_ENOMEM with the tree still
 * consistent (the text is then recorded only in part). */
int pd_cache_tree_insert(struct pd_cache_tree *t, int tenant, const char *s, size_t len);

/* matched[id] for id in [0, n): the longest prefix of s[0..len) the tenant marks (0 for ids
 * beyond the tree's). Returns the longest prefix of s present in the tree at all. Changes
 * nothing (the insert that follows a routing decision refreshes the chosen tenant). */
size_t pd_cache_tree_match(const struct pd_cache_tree *t, const char *s, size_t len,
                           size_t *matched, int n);

/* Every tenant above max bytes loses its least recently used leaves (whole nodes) until it is at
 * most max. Returns the bytes of marks removed. PD_ENOMEM cannot happen... except for the work
 * list: *oom is set when it could not be grown (that tenant is skipped until the next call). */
size_t pd_cache_tree_evict(struct pd_cache_tree *t, size_t max, int *oom);

/* What the tree holds: nodes (without the root) and their text bytes. */
size_t pd_cache_tree_nodes(const struct pd_cache_tree *t);
size_t pd_cache_tree_bytes(const struct pd_cache_tree *t);

/* Tests: every invariant above, walked over the whole tree. PD_OK, or PD_EINVAL naming the
 * first broken one. */
int pd_cache_tree_check(const struct pd_cache_tree *t);

#endif
