/*
 * radix_cache.c — radix tree of page runs with path lock counts and an LRU list.
 *
 * Children are found by their first page of tokens (siblings differ there, as in SGLang's paged
 * RadixCache) through one open-addressing index keyed by (parent, hash of that page): a shared
 * system prompt has thousands of children, and scanning them made a prefill step milliseconds.
 * Matching never splits a node: a prefix that ends inside a node returns the pages up to there and
 * the node itself to lock, which protects a little more than needed and keeps match
 * allocation-free. Insert splits where the new key leaves an existing node. The LRU list holds
 * every node but the root, most recently used at the tail; eviction walks it from the head taking
 * unlocked leaves, so a parent becomes a candidate only after its children are gone.
 */
#include "common/radix_cache.h"

#include "common/base/alloc.h"
#include "common/page_alloc.h"
#include "common/base/status.h"

#include <string.h>

struct pd_radix_node {
    struct pd_radix_node *parent;
    struct pd_radix_node *child; /* first child */
    struct pd_radix_node *next;  /* next sibling */
    struct pd_radix_node *prev;  /* previous sibling: unlinking a leaf is O(1) however many */
    struct pd_radix_node *lru_prev, *lru_next;
    int32_t *tokens; /* [n_pages * page_size] */
    int32_t *pages;  /* [n_pages] */
    int32_t n_pages;
    int32_t lock; /* live locks in this subtree */
    uint64_t key; /* hash of (parent, first page): its place in the child index */
};

struct pd_radix_cache {
    struct pd_page_alloc *pa;
    int32_t page_size;
    bool disabled;
    struct pd_radix_node root;
    struct pd_radix_node *lru_head, *lru_tail;
    int32_t n_pages;
    int32_t n_nodes;
    struct pd_radix_node **index; /* [index_mask + 1] child index, NULL = empty, load <= 1/2 */
    uint32_t index_mask;
};

static uint64_t child_key(const struct pd_radix_cache *rc, const struct pd_radix_node *parent,
                          const int32_t *page_tokens) {
    uint64_t h = (uint64_t)(uintptr_t)parent * 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < rc->page_size; i++)
        h = (h ^ (uint32_t)page_tokens[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

static struct pd_radix_node *find_child(const struct pd_radix_cache *rc,
                                        const struct pd_radix_node *n, const int32_t *page_tokens) {
    uint64_t k = child_key(rc, n, page_tokens);
    size_t bytes = (size_t)rc->page_size * sizeof(int32_t);
    for (uint32_t i = (uint32_t)k & rc->index_mask; rc->index[i]; i = (i + 1) & rc->index_mask) {
        struct pd_radix_node *c = rc->index[i];
        if (c->key == k && c->parent == n && memcmp(c->tokens, page_tokens, bytes) == 0)
            return c;
    }
    return NULL;
}

static void index_put(struct pd_radix_cache *rc, struct pd_radix_node *c) {
    uint32_t i = (uint32_t)c->key & rc->index_mask;
    while (rc->index[i])
        i = (i + 1) & rc->index_mask;
    rc->index[i] = c;
}

static uint32_t index_slot(const struct pd_radix_cache *rc, const struct pd_radix_node *c) {
    uint32_t i = (uint32_t)c->key & rc->index_mask;
    while (rc->index[i] != c)
        i = (i + 1) & rc->index_mask;
    return i;
}

static void index_del(struct pd_radix_cache *rc, const struct pd_radix_node *c) {
    uint32_t hole = index_slot(rc, c), m = rc->index_mask;
    for (uint32_t j = (hole + 1) & m; rc->index[j]; j = (j + 1) & m) {
        uint32_t h = (uint32_t)rc->index[j]->key & m;
        if (((j - h) & m) >= ((j - hole) & m)) { /* j may move back into the hole */
            rc->index[hole] = rc->index[j];
            hole = j;
        }
    }
    rc->index[hole] = NULL;
}

/* Room for `extra` more nodes at load <= 1/2, so a structural change cannot fail halfway. */
static int index_reserve(struct pd_radix_cache *rc, int32_t extra) {
    uint32_t cap = rc->index_mask + 1;
    if ((uint64_t)(rc->n_nodes + extra) * 2 <= cap)
        return PD_OK;
    while ((uint64_t)(rc->n_nodes + extra) * 2 > cap)
        cap *= 2;
    struct pd_radix_node **old = rc->index;
    uint32_t old_cap = rc->index_mask + 1;
    rc->index = pd_calloc(cap, sizeof(*rc->index));
    if (!rc->index) {
        rc->index = old;
        return PD_ENOMEM;
    }
    rc->index_mask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i])
            index_put(rc, old[i]);
    pd_free(old);
    return PD_OK;
}

int pd_radix_cache_new(struct pd_page_alloc *pa, int32_t page_size, bool disabled,
                       struct pd_radix_cache **out) {
    *out = NULL;
    if (page_size <= 0)
        return pd_errorf(PD_EINVAL, "prefix cache with page size %d", (int)page_size);
    struct pd_radix_cache *rc = pd_calloc(1, sizeof(*rc));
    if (!rc)
        return pd_error_wrap(PD_ENOMEM, "creating the prefix cache");
    rc->pa = pa;
    rc->page_size = page_size;
    rc->disabled = disabled;
    rc->index_mask = 63;
    rc->index = pd_calloc(rc->index_mask + 1, sizeof(*rc->index));
    if (!rc->index) {
        pd_free(rc);
        return pd_error_wrap(PD_ENOMEM, "creating the prefix cache");
    }
    *out = rc;
    return PD_OK;
}

bool pd_radix_cache_disabled(const struct pd_radix_cache *rc) {
    return rc->disabled;
}

static void lru_unlink(struct pd_radix_cache *rc, struct pd_radix_node *n) {
    if (n->lru_prev)
        n->lru_prev->lru_next = n->lru_next;
    else
        rc->lru_head = n->lru_next;
    if (n->lru_next)
        n->lru_next->lru_prev = n->lru_prev;
    else
        rc->lru_tail = n->lru_prev;
    n->lru_prev = n->lru_next = NULL;
}

static void lru_append(struct pd_radix_cache *rc, struct pd_radix_node *n) {
    n->lru_prev = rc->lru_tail;
    n->lru_next = NULL;
    if (rc->lru_tail)
        rc->lru_tail->lru_next = n;
    else
        rc->lru_head = n;
    rc->lru_tail = n;
}

/* Marks a path used: the deepest node ends up oldest of the path, so ancestors (which cannot go
 * before it anyway) are not scanned first. */
static void touch_path(struct pd_radix_cache *rc, struct pd_radix_node *n) {
    for (; n && n != &rc->root; n = n->parent) {
        lru_unlink(rc, n);
        lru_append(rc, n);
    }
}

/* Whole pages of c matching key[0..max_pages) (the first is known to match). */
static int32_t common_pages(const struct pd_radix_cache *rc, const struct pd_radix_node *c,
                            const int32_t *key, int32_t max_pages) {
    int32_t lim = c->n_pages < max_pages ? c->n_pages : max_pages;
    int32_t j = 1;
    size_t bytes = (size_t)rc->page_size * sizeof(int32_t);
    while (j < lim && memcmp(c->tokens + (size_t)j * rc->page_size, key + (size_t)j * rc->page_size,
                             bytes) == 0)
        j++;
    return j;
}

void pd_radix_cache_match(struct pd_radix_cache *rc, const int32_t *tokens, int32_t n_tokens,
                          int32_t *pages, struct pd_radix_match *m) {
    m->n_pages = 0;
    m->node = &rc->root;
    if (rc->disabled)
        return;
    int32_t want = n_tokens / rc->page_size;
    struct pd_radix_node *n = &rc->root;
    while (m->n_pages < want) {
        const int32_t *key = tokens + (size_t)m->n_pages * rc->page_size;
        struct pd_radix_node *c = find_child(rc, n, key);
        if (!c)
            break;
        int32_t j = common_pages(rc, c, key, want - m->n_pages);
        memcpy(pages + m->n_pages, c->pages, (size_t)j * sizeof(int32_t));
        m->n_pages += j;
        n = c;
        if (j < c->n_pages)
            break;
    }
    m->node = n;
    touch_path(rc, n);
}

static struct pd_radix_node *node_new(int32_t n_pages, int32_t page_size) {
    size_t toks = (size_t)n_pages * (size_t)page_size;
    struct pd_radix_node *n = pd_malloc(sizeof(*n) + (toks + (size_t)n_pages) * sizeof(int32_t));
    if (!n)
        return NULL;
    memset(n, 0, sizeof(*n));
    n->tokens = (int32_t *)(n + 1);
    n->pages = n->tokens + toks;
    n->n_pages = n_pages;
    return n;
}

static void link_child(struct pd_radix_node *parent, struct pd_radix_node *c) {
    c->parent = parent;
    c->prev = NULL;
    c->next = parent->child;
    if (c->next)
        c->next->prev = c;
    parent->child = c;
}

static void unlink_child(struct pd_radix_node *c) {
    if (c->prev)
        c->prev->next = c->next;
    else
        c->parent->child = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next = c->prev = NULL;
}

/* Splits c after j pages: a new node takes c's first j pages and becomes c's parent. */
static struct pd_radix_node *split(struct pd_radix_cache *rc, struct pd_radix_node *c, int32_t j) {
    struct pd_radix_node *p = node_new(j, rc->page_size);
    if (!p)
        return NULL;
    size_t ps = (size_t)rc->page_size;
    memcpy(p->tokens, c->tokens, (size_t)j * ps * sizeof(int32_t));
    memcpy(p->pages, c->pages, (size_t)j * sizeof(int32_t));
    int32_t rest = c->n_pages - j;
    memmove(c->tokens, c->tokens + (size_t)j * ps, (size_t)rest * ps * sizeof(int32_t));
    /* c->pages sits right after c->tokens: move it down to follow the shorter token array */
    int32_t *np = c->tokens + (size_t)rest * ps;
    memmove(np, c->pages + j, (size_t)rest * sizeof(int32_t));
    c->pages = np;
    c->n_pages = rest;
    p->lock = c->lock; /* every lock below c is below p too */
    p->key = c->key;   /* same parent, same first page */
    rc->index[index_slot(rc, c)] = p;
    struct pd_radix_node *parent = c->parent;
    unlink_child(c);
    link_child(parent, p);
    link_child(p, c);
    c->key = child_key(rc, p, c->tokens);
    index_put(rc, c);
    /* p is as recent as c, and older than it in the list so c goes first */
    p->lru_prev = c->lru_prev;
    p->lru_next = c;
    if (c->lru_prev)
        c->lru_prev->lru_next = p;
    else
        rc->lru_head = p;
    c->lru_prev = p;
    rc->n_nodes++;
    return p;
}

int pd_radix_cache_insert(struct pd_radix_cache *rc, const int32_t *tokens, int32_t n_pages,
                          const int32_t *pages, struct pd_radix_node **node) {
    *node = &rc->root;
    if (rc->disabled || n_pages <= 0)
        return PD_OK;
    struct pd_radix_node *n = &rc->root;
    int32_t done = 0;
    size_t ps = (size_t)rc->page_size;
    while (done < n_pages) {
        const int32_t *key = tokens + (size_t)done * ps;
        if (index_reserve(rc, 2) != PD_OK)
            goto fail;
        struct pd_radix_node *c = find_child(rc, n, key);
        if (!c) {
            int32_t k = n_pages - done;
            struct pd_radix_node *leaf = node_new(k, rc->page_size);
            if (!leaf)
                goto fail;
            memcpy(leaf->tokens, key, (size_t)k * ps * sizeof(int32_t));
            memcpy(leaf->pages, pages + done, (size_t)k * sizeof(int32_t));
            for (int32_t i = 0; i < k; i++)
                pd_page_alloc_cache_hold(rc->pa, leaf->pages[i]);
            link_child(n, leaf);
            leaf->key = child_key(rc, n, leaf->tokens);
            index_put(rc, leaf);
            lru_append(rc, leaf);
            rc->n_nodes++;
            rc->n_pages += k;
            n = leaf;
            break;
        }
        int32_t j = common_pages(rc, c, key, n_pages - done);
        if (j < c->n_pages) {
            c = split(rc, c, j);
            if (!c)
                goto fail;
        }
        done += j;
        n = c;
    }
    touch_path(rc, n);
    *node = n;
    return PD_OK;

fail:
    touch_path(rc, n);
    *node = n;
    return pd_error_wrap(PD_ENOMEM, "inserting %d pages into the prefix cache", (int)n_pages);
}

void pd_radix_cache_lock(struct pd_radix_cache *rc, struct pd_radix_node *node) {
    if (!node || node == &rc->root)
        return;
    for (struct pd_radix_node *n = node; n; n = n->parent)
        n->lock++;
}

void pd_radix_cache_unlock(struct pd_radix_cache *rc, struct pd_radix_node *node) {
    if (!node || node == &rc->root)
        return;
    for (struct pd_radix_node *n = node; n; n = n->parent) {
        PD_ASSERT(n->lock > 0);
        n->lock--;
    }
}

/* Removes an unlocked leaf; returns the pages that became free. */
static int32_t evict_leaf(struct pd_radix_cache *rc, struct pd_radix_node *n) {
    int32_t freed = 0;
    for (int32_t i = 0; i < n->n_pages; i++) {
        freed += pd_page_alloc_refcount(rc->pa, n->pages[i]) == 1;
        pd_page_alloc_cache_drop(rc->pa, n->pages[i]);
    }
    rc->n_pages -= n->n_pages;
    rc->n_nodes--;
    index_del(rc, n);
    unlink_child(n);
    lru_unlink(rc, n);
    pd_free(n);
    return freed;
}

int32_t pd_radix_cache_evict(struct pd_radix_cache *rc, int32_t n_pages) {
    int32_t freed = 0;
    bool progress = true;
    while (freed < n_pages && progress) {
        progress = false;
        struct pd_radix_node *n = rc->lru_head;
        while (n && freed < n_pages) {
            struct pd_radix_node *next = n->lru_next;
            if (!n->child && n->lock == 0) {
                freed += evict_leaf(rc, n);
                progress = true;
            }
            n = next;
        }
    }
    return freed;
}

int32_t pd_radix_cache_flush(struct pd_radix_cache *rc) {
    return pd_radix_cache_evict(rc, INT32_MAX);
}

void pd_radix_cache_free(struct pd_radix_cache *rc) {
    if (!rc)
        return;
    pd_radix_cache_flush(rc);
    PD_ASSERT(rc->n_nodes == 0); /* a locked entry outlived its request */
    pd_free(rc->index);
    pd_free(rc);
}

int32_t pd_radix_cache_n_pages(const struct pd_radix_cache *rc) {
    return rc->n_pages;
}

int32_t pd_radix_cache_n_nodes(const struct pd_radix_cache *rc) {
    return rc->n_nodes;
}

int32_t pd_radix_cache_root_lock(const struct pd_radix_cache *rc) {
    return rc->root.lock;
}

static int check_node(const struct pd_radix_cache *rc, const struct pd_radix_node *n,
                      int32_t *nodes, int32_t *pages) {
    int32_t child_locks = 0;
    for (const struct pd_radix_node *c = n->child; c; c = c->next) {
        if (c->parent != n || (c->prev ? c->prev->next != c : n->child != c))
            return pd_errorf(PD_EINTERNAL, "prefix cache: child with a wrong parent or sibling");
        if (c->n_pages <= 0)
            return pd_errorf(PD_EINTERNAL, "prefix cache: empty node");
        for (int32_t i = 0; i < c->n_pages; i++)
            if (!pd_page_alloc_is_cached(rc->pa, c->pages[i]))
                return pd_errorf(PD_EINTERNAL, "prefix cache: page %d not held by the cache",
                                 (int)c->pages[i]);
        if (find_child(rc, n, c->tokens) != c)
            return pd_errorf(PD_EINTERNAL, "prefix cache: child index misses a node");
        child_locks += c->lock;
        *nodes += 1;
        *pages += c->n_pages;
        int rc2 = check_node(rc, c, nodes, pages);
        if (rc2)
            return rc2;
    }
    if (n->lock < child_locks || n->lock < 0)
        return pd_errorf(PD_EINTERNAL, "prefix cache: lock %d below its children's %d",
                         (int)n->lock, (int)child_locks);
    return PD_OK;
}

int pd_radix_cache_check(const struct pd_radix_cache *rc) {
    int32_t nodes = 0, pages = 0, listed = 0;
    int r = check_node(rc, &rc->root, &nodes, &pages);
    if (r)
        return r;
    for (const struct pd_radix_node *n = rc->lru_head; n; n = n->lru_next)
        listed++;
    if (nodes != rc->n_nodes || pages != rc->n_pages || listed != nodes)
        return pd_errorf(PD_EINTERNAL, "prefix cache: %d nodes %d pages %d listed, counters %d %d",
                         (int)nodes, (int)pages, (int)listed, (int)rc->n_nodes, (int)rc->n_pages);
    return PD_OK;
}
