/*
 * cache_tree.c — the approximate prefix tree (see cache_tree.h). Children are found by their
 * first byte with a linear scan (at most 256 per node, usually a handful); marks are a small
 * array per node (one entry per tenant that passed through). Walks over whole subtrees follow
 * parent links instead of recursing or keeping a stack: a tree of long, diverging prompts can be
 * thousands of nodes deep, and removing a tenant must not fail for want of memory.
 */
#include "router/cache_tree.h"

#include "common/base/alloc.h"
#include "common/base/status.h"

#include <stdbool.h>
#include <string.h>

struct mark {
    int tenant;
    uint64_t last; /* logical time of the tenant's latest insert through this node */
};

struct node {
    struct node *parent;
    char *text; /* the edge from parent; len > 0 except at the root */
    size_t len;
    struct node **kids;
    size_t n_kids, cap_kids;
    struct mark *marks;
    size_t n_marks, cap_marks;
};

struct pd_cache_tree {
    struct node root;
    uint64_t clock;
    size_t *size; /* [cap] bytes each tenant marks */
    bool *live;   /* [cap] */
    size_t cap;
    size_t n_nodes, bytes;
};

int pd_cache_tree_new(struct pd_cache_tree **out) {
    *out = pd_calloc(1, sizeof(**out));
    return *out ? PD_OK : pd_errorf(PD_ENOMEM, "cache-aware prefix tree");
}

static void node_free_one(struct node *n) {
    pd_free(n->text);
    pd_free(n->kids);
    pd_free(n->marks);
    pd_free(n);
}

/* Frees n and everything below it (n already unlinked from its parent): leaves first, each
 * the last kid of its parent, climbing back up by the parent links. */
static void subtree_free(struct pd_cache_tree *t, struct node *n) {
    struct node *x = n;
    for (;;) {
        while (x->n_kids)
            x = x->kids[x->n_kids - 1];
        struct node *parent = x->parent;
        t->n_nodes--;
        t->bytes -= x->len;
        node_free_one(x);
        if (x == n)
            return;
        parent->n_kids--;
        x = parent;
    }
}

void pd_cache_tree_free(struct pd_cache_tree *t) {
    if (!t)
        return;
    for (size_t i = 0; i < t->root.n_kids; i++)
        subtree_free(t, t->root.kids[i]);
    pd_free(t->root.kids);
    pd_free(t->size);
    pd_free(t->live);
    pd_free(t);
}

int pd_cache_tree_tenant_add(struct pd_cache_tree *t, int *id) {
    size_t i = 0;
    while (i < t->cap && t->live[i])
        i++;
    if (i == t->cap) {
        size_t cap_s = t->cap, cap_l = t->cap;
        if (pd_array_grow((void **)&t->size, &cap_s, t->cap + 1, sizeof(*t->size)) ||
            pd_array_grow((void **)&t->live, &cap_l, t->cap + 1, sizeof(*t->live)))
            return pd_errorf(PD_ENOMEM, "cache-aware prefix tree: adding a worker");
        size_t cap = cap_s < cap_l ? cap_s : cap_l;
        for (size_t k = t->cap; k < cap; k++) {
            t->size[k] = 0;
            t->live[k] = false;
        }
        t->cap = cap;
    }
    t->live[i] = true;
    t->size[i] = 0;
    *id = (int)i;
    return PD_OK;
}

int pd_cache_tree_tenant_cap(const struct pd_cache_tree *t) {
    return (int)t->cap;
}

size_t pd_cache_tree_tenant_size(const struct pd_cache_tree *t, int id) {
    return id >= 0 && (size_t)id < t->cap && t->live[id] ? t->size[id] : 0;
}

size_t pd_cache_tree_nodes(const struct pd_cache_tree *t) {
    return t->n_nodes;
}

size_t pd_cache_tree_bytes(const struct pd_cache_tree *t) {
    return t->bytes;
}

static struct mark *mark_of(const struct node *n, int tenant) {
    for (size_t i = 0; i < n->n_marks; i++)
        if (n->marks[i].tenant == tenant)
            return &n->marks[i];
    return NULL;
}

/* Removes tenant's mark from n (present). */
static void unmark(struct pd_cache_tree *t, struct node *n, int tenant) {
    struct mark *m = mark_of(n, tenant);
    PD_ASSERT(m);
    *m = n->marks[--n->n_marks];
    t->size[tenant] -= n->len;
}

static struct node *kid_of(const struct node *n, unsigned char c) {
    for (size_t i = 0; i < n->n_kids; i++)
        if ((unsigned char)n->kids[i]->text[0] == c)
            return n->kids[i];
    return NULL;
}

static void kid_unlink(struct node *parent, struct node *kid) {
    for (size_t i = 0; i < parent->n_kids; i++)
        if (parent->kids[i] == kid) {
            parent->kids[i] = parent->kids[--parent->n_kids];
            return;
        }
    PD_ASSERT(!"kid not found under its parent");
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Splits kid after its first k bytes (0 < k < kid->len): a new node holding them, with kid's
 * marks, takes kid's place; kid keeps the rest. Returns the new node, NULL on ENOMEM (unchanged).
 */
static struct node *split(struct pd_cache_tree *t, struct node *kid, size_t k) {
    struct node *mid = pd_calloc(1, sizeof(*mid));
    char *head = pd_strndup(kid->text, k);
    char *tail = pd_strndup(kid->text + k, kid->len - k);
    struct mark *marks = pd_malloc(kid->n_marks * sizeof(*marks));
    struct node **kids = pd_malloc(sizeof(*kids));
    if (!mid || !head || !tail || !marks || !kids) {
        pd_free(mid);
        pd_free(head);
        pd_free(tail);
        pd_free(marks);
        pd_free(kids);
        return NULL;
    }
    struct node *parent = kid->parent;
    for (size_t i = 0; i < parent->n_kids; i++)
        if (parent->kids[i] == kid)
            parent->kids[i] = mid;
    memcpy(marks, kid->marks, kid->n_marks * sizeof(*marks));
    *mid = (struct node){.parent = parent,
                         .text = head,
                         .len = k,
                         .kids = kids,
                         .n_kids = 1,
                         .cap_kids = 1,
                         .marks = marks,
                         .n_marks = kid->n_marks,
                         .cap_marks = kid->n_marks};
    kids[0] = kid;
    pd_free(kid->text);
    kid->text = tail;
    kid->len -= k;
    kid->parent = mid;
    /* the same bytes, now in two nodes marked alike: sizes and bytes are unchanged */
    t->n_nodes++;
    return mid;
}

/* Gives n tenant's mark at time now (sizes count its bytes the first time). */
static int mark(struct pd_cache_tree *t, struct node *n, int tenant, uint64_t now) {
    struct mark *m = mark_of(n, tenant);
    if (m) {
        m->last = now;
        return PD_OK;
    }
    if (pd_array_grow((void **)&n->marks, &n->cap_marks, n->n_marks + 1, sizeof(*n->marks)))
        return PD_ENOMEM;
    n->marks[n->n_marks++] = (struct mark){.tenant = tenant, .last = now};
    t->size[tenant] += n->len;
    return PD_OK;
}

int pd_cache_tree_insert(struct pd_cache_tree *t, int tenant, const char *s, size_t len) {
    PD_ASSERT(tenant >= 0 && (size_t)tenant < t->cap && t->live[tenant]);
    uint64_t now = ++t->clock;
    struct node *at = &t->root;
    size_t i = 0;
    while (i < len) {
        struct node *kid = kid_of(at, (unsigned char)s[i]);
        if (!kid) {
            struct node *leaf = pd_calloc(1, sizeof(*leaf));
            char *text = pd_strndup(s + i, len - i);
            if (!leaf || !text ||
                pd_array_grow((void **)&at->kids, &at->cap_kids, at->n_kids + 1,
                              sizeof(*at->kids))) {
                pd_free(leaf);
                pd_free(text);
                goto oom;
            }
            *leaf = (struct node){.parent = at, .text = text, .len = len - i};
            if (mark(t, leaf, tenant, now)) {
                node_free_one(leaf);
                goto oom;
            }
            at->kids[at->n_kids++] = leaf;
            t->n_nodes++;
            t->bytes += leaf->len;
            return PD_OK;
        }
        size_t k = common_prefix(kid->text, kid->len, s + i, len - i);
        if (k < kid->len && !(kid = split(t, kid, k)))
            goto oom;
        if (mark(t, kid, tenant, now))
            goto oom;
        i += k;
        at = kid;
    }
    return PD_OK;
oom:
    return pd_errorf(PD_ENOMEM, "cache-aware prefix tree: recording a request");
}

size_t pd_cache_tree_match(const struct pd_cache_tree *t, const char *s, size_t len,
                           size_t *matched, int n) {
    for (int k = 0; k < n; k++)
        matched[k] = 0;
    const struct node *at = &t->root;
    size_t i = 0;
    while (i < len) {
        const struct node *kid = kid_of(at, (unsigned char)s[i]);
        if (!kid)
            break;
        size_t k = common_prefix(kid->text, kid->len, s + i, len - i);
        i += k;
        /* marks are prefix-closed: deeper nodes only raise a tenant's match */
        for (size_t m = 0; m < kid->n_marks; m++)
            if (kid->marks[m].tenant < n)
                matched[kid->marks[m].tenant] = i;
        if (k < kid->len)
            break;
        at = kid;
    }
    return i;
}

/* Unlinks and frees n when no tenant marks it any more (its kids are then unmarked too, so
 * there are none). Returns whether it went. */
static bool drop_if_unmarked(struct pd_cache_tree *t, struct node *n) {
    if (n->n_marks)
        return false;
    kid_unlink(n->parent, n);
    subtree_free(t, n);
    return true;
}

static size_t index_in(const struct node *parent, const struct node *kid) {
    size_t i = 0;
    while (parent->kids[i] != kid)
        i++;
    return i;
}

/* The node a pre-order walk visits after parent's kids before index i: kid i, or the next one
 * up the tree; NULL when the walk is over. */
static struct node *next_from(const struct pd_cache_tree *t, struct node *parent, size_t i) {
    for (;;) {
        if (i < parent->n_kids)
            return parent->kids[i];
        if (parent == &t->root)
            return NULL;
        i = index_in(parent->parent, parent) + 1;
        parent = parent->parent;
    }
}

/* The walk's next node after x without entering x's subtree. */
static struct node *next_past(const struct pd_cache_tree *t, struct node *x) {
    return next_from(t, x->parent, index_in(x->parent, x) + 1);
}

void pd_cache_tree_tenant_remove(struct pd_cache_tree *t, int id) {
    if (id < 0 || (size_t)id >= t->cap || !t->live[id])
        return;
    struct node *x = next_from(t, &t->root, 0);
    while (x) {
        struct mark *m = mark_of(x, id);
        if (!m) { /* nothing below is the tenant's either */
            x = next_past(t, x);
            continue;
        }
        unmark(t, x, id);
        if (x->n_marks == 0) {
            /* the tenant was its only one, so also of everything below: all of it goes; the
             * unlink moves the parent's last kid into x's place, still to be visited */
            struct node *parent = x->parent;
            size_t i = index_in(parent, x);
            kid_unlink(parent, x);
            subtree_free(t, x);
            x = next_from(t, parent, i);
            continue;
        }
        x = next_from(t, x, 0);
    }
    /* subtrees freed whole held the tenant's bytes without being unmarked one by one */
    t->size[id] = 0;
    t->live[id] = false;
}

/* A min-heap of a tenant's leaves by access time. */
struct leaf {
    uint64_t last;
    struct node *n;
};

static void heap_push(struct leaf *h, size_t *n, struct leaf x) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].last > x.last) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static struct leaf heap_pop(struct leaf *h, size_t *n) {
    struct leaf top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1].last < h[c].last)
            c++;
        if (h[c].last >= x.last)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = x;
    return top;
}

static bool leaf_for(const struct node *n, int tenant) {
    for (size_t i = 0; i < n->n_kids; i++)
        if (mark_of(n->kids[i], tenant))
            return false;
    return true;
}

/* Evicts tenant down to max bytes; false (nothing evicted) when the heap could not be
 * allocated. */
static bool evict_tenant(struct pd_cache_tree *t, int tenant, size_t max, size_t *evicted) {
    struct leaf *heap = NULL;
    size_t n_heap = 0, cap_heap = 0;
    /* the tenant's leaves: nodes it marks where none of their kids is its */
    struct node *x = next_from(t, &t->root, 0);
    while (x) {
        const struct mark *m = mark_of(x, tenant);
        if (!m) {
            x = next_past(t, x);
            continue;
        }
        if (leaf_for(x, tenant)) {
            if (pd_array_grow((void **)&heap, &cap_heap, n_heap + 1, sizeof(*heap))) {
                pd_free(heap);
                return false;
            }
            heap_push(heap, &n_heap, (struct leaf){m->last, x});
        }
        x = next_from(t, x, 0);
    }
    /* the heap never grows past the leaves found: a parent that becomes a leaf replaces the
     * kid just popped */
    while (t->size[tenant] > max && n_heap) {
        struct leaf l = heap_pop(heap, &n_heap);
        struct node *parent = l.n->parent;
        *evicted += l.n->len;
        unmark(t, l.n, tenant);
        drop_if_unmarked(t, l.n);
        if (parent != &t->root && leaf_for(parent, tenant))
            heap_push(heap, &n_heap, (struct leaf){mark_of(parent, tenant)->last, parent});
    }
    pd_free(heap);
    return true;
}

size_t pd_cache_tree_evict(struct pd_cache_tree *t, size_t max, int *oom) {
    size_t evicted = 0;
    if (oom)
        *oom = 0;
    for (size_t id = 0; id < t->cap; id++) {
        if (!t->live[id] || t->size[id] <= max)
            continue;
        if (!evict_tenant(t, (int)id, max, &evicted) && oom)
            *oom = 1;
    }
    return evicted;
}

/* ---------------------------------------------------------------- invariants (tests) */

static int check_node(const struct pd_cache_tree *t, const struct node *x, size_t *sizes,
                      size_t *nodes, size_t *bytes) {
    if (x->len == 0 || !x->text)
        return pd_errorf(PD_EINVAL, "cache tree: a node with an empty edge");
    if (x->n_marks == 0)
        return pd_errorf(PD_EINVAL, "cache tree: a node no tenant marks");
    (*nodes)++;
    *bytes += x->len;
    for (size_t m = 0; m < x->n_marks; m++) {
        int id = x->marks[m].tenant;
        if (id < 0 || (size_t)id >= t->cap || !t->live[id])
            return pd_errorf(PD_EINVAL, "cache tree: a mark of tenant %d, not live", id);
        for (size_t k = m + 1; k < x->n_marks; k++)
            if (x->marks[k].tenant == id)
                return pd_errorf(PD_EINVAL, "cache tree: tenant %d marks a node twice", id);
        sizes[id] += x->len;
        if (x->parent->parent) { /* below another node: prefix-closed, parent at least as new */
            const struct mark *pm = mark_of(x->parent, id);
            if (!pm)
                return pd_errorf(PD_EINVAL, "cache tree: tenant %d marks a node, not its parent",
                                 id);
            if (pm->last < x->marks[m].last)
                return pd_errorf(PD_EINVAL, "cache tree: tenant %d's parent mark is older", id);
        }
    }
    for (size_t i = 0; i < x->n_kids; i++) {
        if (x->kids[i]->parent != x)
            return pd_errorf(PD_EINVAL, "cache tree: a kid whose parent link is wrong");
        for (size_t k = i + 1; k < x->n_kids; k++)
            if (x->kids[i]->text[0] == x->kids[k]->text[0])
                return pd_errorf(PD_EINVAL, "cache tree: two kids start with the same byte");
        int rc = check_node(t, x->kids[i], sizes, nodes, bytes);
        if (rc)
            return rc;
    }
    return PD_OK;
}

int pd_cache_tree_check(const struct pd_cache_tree *t) {
    size_t *sizes = pd_calloc(t->cap ? t->cap : 1, sizeof(*sizes));
    if (!sizes)
        return pd_errorf(PD_ENOMEM, "cache tree check");
    size_t nodes = 0, bytes = 0;
    int rc = PD_OK;
    for (size_t i = 0; i < t->root.n_kids && !rc; i++) {
        if (t->root.kids[i]->parent != &t->root)
            rc = pd_errorf(PD_EINVAL, "cache tree: a root kid whose parent link is wrong");
        for (size_t k = i + 1; k < t->root.n_kids && !rc; k++)
            if (t->root.kids[i]->text[0] == t->root.kids[k]->text[0])
                rc = pd_errorf(PD_EINVAL, "cache tree: two root kids start with the same byte");
        if (!rc)
            rc = check_node(t, t->root.kids[i], sizes, &nodes, &bytes);
    }
    for (size_t id = 0; id < t->cap && !rc; id++)
        if (sizes[id] != (t->live[id] ? t->size[id] : 0))
            rc = pd_errorf(PD_EINVAL, "cache tree: tenant %zu's size %zu, its marks hold %zu", id,
                           t->size[id], sizes[id]);
    if (!rc && (nodes != t->n_nodes || bytes != t->bytes))
        rc = pd_errorf(PD_EINVAL, "cache tree: %zu nodes / %zu bytes counted, %zu / %zu walked",
                       t->n_nodes, t->bytes, nodes, bytes);
    pd_free(sizes);
    return rc;
}
