/*
 * graph.c - CUDA graphs themselves: create and destroy a graph, add a node
 * (graph_node.c has each kind of node and its parameters), its nodes and
 * edges, queries on them, child graph nodes (which hold a clone), cloning,
 * the user objects a graph holds, and cuGraphDebugDotPrint.
 * graph_exec.c makes executables of graphs; capture.c records them from
 * streams.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "init.h"

VGPU_EXPORT CUresult cuGraphClone(CUgraph *out, CUgraph src);

VGPU_EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pg || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = cu_obj_new(sizeof *g, MAGIC_GRAPH);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pg = g;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    if (!cu_obj_is(g, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *n = g->nodes[i];
        if (n->type == NODE_GRAPH)
            cuGraphDestroy(n->child);
        free(n->deps);
        free(n->attrs);
        cu_obj_del(n, sizeof *n);
    }
    free(g->nodes);
    cu_graph_users_release(g->users, g->nusers);
    free(g->users);
    cu_obj_del(g, sizeof *g);
    return CUDA_SUCCESS;
}

CUresult cu_graph_add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                           struct CUgraphNode_st *proto)
{
    if (!out || !cu_obj_is(g, MAGIC_GRAPH) || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!cu_obj_is(deps[i], MAGIC_NODE) || deps[i]->graph != g)
            return CUDA_ERROR_INVALID_VALUE;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct CUgraphNode_st **t = realloc(g->nodes, cap * sizeof *t);
        if (!t)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = t;
        g->cap = cap;
    }
    struct CUgraphNode_st **d = ndeps ? malloc(ndeps * sizeof *d) : NULL;
    if (ndeps && !d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUgraphNode_st *n = cu_obj_new(sizeof *n, MAGIC_NODE);
    if (!n) {
        free(d);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *n = *proto;
    n->magic = MAGIC_NODE;
    n->graph = g;
    n->attrs = NULL;
    if (ndeps)
        memcpy(d, deps, ndeps * sizeof *d);
    n->deps = d;
    n->ndeps = ndeps;
    g->nodes[g->n++] = n;
    *out = n;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *count)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !count)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        size_t n = *count < g->n ? *count : g->n;
        for (size_t i = 0; i < n; i++)
            nodes[i] = g->nodes[i];
        for (size_t i = n; i < *count; i++)
            nodes[i] = NULL;
    }
    *count = g->n;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, int *type)
{
    if (!cu_obj_is(n, MAGIC_NODE) || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphDestroyNode(CUgraphNode n)
{
    if (!cu_obj_is(n, MAGIC_NODE))
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = n->graph;
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i] == n) {
            memmove(&g->nodes[i], &g->nodes[i + 1], (g->n - i - 1) * sizeof *g->nodes);
            g->n--;
            break;
        }
    }
    for (size_t i = 0; i < g->n; i++) { /* its edges go with it */
        struct CUgraphNode_st *m = g->nodes[i];
        size_t k = 0;
        for (size_t j = 0; j < m->ndeps; j++)
            if (m->deps[j] != n)
                m->deps[k++] = m->deps[j];
        m->ndeps = k;
    }
    free(n->deps);
    free(n->attrs);
    if (n->type == NODE_GRAPH)
        cuGraphDestroy(n->child);
    cu_obj_del(n, sizeof *n);
    return CUDA_SUCCESS;
}

CUresult cu_graph_node_of(CUgraphNode n, int type)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return cu_obj_is(n, MAGIC_NODE) && (type < 0 || n->type == type) ? CUDA_SUCCESS
                                                                      : CUDA_ERROR_INVALID_VALUE;
}

/* ---- child graphs ---- */

VGPU_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g,
                                              const CUgraphNode *deps, size_t ndeps,
                                              CUgraph child)
{
    if (!cu_obj_is(child, MAGIC_GRAPH) || child == g)
        return CUDA_ERROR_INVALID_VALUE;
    /* the node holds a copy: later changes to `child` don't reach it */
    CUgraph copy;
    CUresult rc = cuGraphClone(&copy, child);
    if (rc)
        return rc;
    struct CUgraphNode_st proto = {.type = NODE_GRAPH, .child = copy};
    rc = cu_graph_add_node(out, g, deps, ndeps, &proto);
    if (rc)
        cuGraphDestroy(copy);
    return rc;
}

VGPU_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *child)
{
    CUresult rc = cu_graph_node_of(n, NODE_GRAPH);
    if (!rc && !child)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *child = n->child;
    return rc;
}

/* ---- edges ---- */

static int has_dep(struct CUgraphNode_st *to, struct CUgraphNode_st *from)
{
    for (size_t j = 0; j < to->ndeps; j++)
        if (to->deps[j] == from)
            return 1;
    return 0;
}

static CUresult edge_args(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || (n && (!from || !to)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++)
        if (!cu_obj_is(from[i], MAGIC_NODE) || !cu_obj_is(to[i], MAGIC_NODE) ||
            from[i]->graph != g || to[i]->graph != g || from[i] == to[i])
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode *from,
                                            const CUgraphNode *to, size_t n)
{
    CUresult rc = edge_args(g, from, to, n);
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        if (has_dep(to[i], from[i]))
            return CUDA_ERROR_INVALID_VALUE; /* already there */
        struct CUgraphNode_st **d = realloc(to[i]->deps, (to[i]->ndeps + 1) * sizeof *d);
        if (!d)
            return CUDA_ERROR_OUT_OF_MEMORY;
        d[to[i]->ndeps++] = from[i];
        to[i]->deps = d;
    }
    return rc;
}

VGPU_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode *from,
                                               const CUgraphNode *to, const void *edges,
                                               size_t n)
{
    (void)edges; /* every edge is a full dependency here */
    return cuGraphAddDependencies(g, from, to, n);
}

VGPU_EXPORT CUresult cuGraphRemoveDependencies(CUgraph g, const CUgraphNode *from,
                                               const CUgraphNode *to, size_t n)
{
    CUresult rc = edge_args(g, from, to, n);
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++)
        if (!has_dep(to[i], from[i]))
            rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        struct CUgraphNode_st *t = to[i];
        size_t k = 0;
        for (size_t j = 0; j < t->ndeps; j++)
            if (t->deps[j] != from[i])
                t->deps[k++] = t->deps[j];
        t->ndeps = k;
    }
    return rc;
}

VGPU_EXPORT CUresult cuGraphRemoveDependencies_v2(CUgraph g, const CUgraphNode *from,
                                                  const CUgraphNode *to, const void *edges,
                                                  size_t n)
{
    (void)edges;
    return cuGraphRemoveDependencies(g, from, to, n);
}

/* CUgraphEdgeData: 8 bytes, all zero for a full dependency. */
static void zero_edges(void *edges, size_t n)
{
    if (edges)
        memset(edges, 0, 8 * n);
}

VGPU_EXPORT CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to,
                                        void *edges, size_t *count)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !count || (!from != !to))
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0;
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *t = g->nodes[i];
        for (size_t j = 0; j < t->ndeps; j++, total++) {
            if (from && total < *count) {
                from[total] = t->deps[j];
                to[total] = t;
            }
        }
    }
    if (from) {
        for (size_t i = total; i < *count; i++)
            from[i] = to[i] = NULL;
        zero_edges(edges, *count);
    }
    *count = total;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to,
                                     size_t *count)
{
    return cuGraphGetEdges_v2(g, from, to, NULL, count);
}

VGPU_EXPORT CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode *roots, size_t *count)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !count)
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i]->ndeps)
            continue;
        if (roots && total < *count)
            roots[total] = g->nodes[i];
        total++;
    }
    for (size_t i = total; roots && i < *count; i++)
        roots[i] = NULL;
    *count = total;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetDependencies_v2(CUgraphNode n, CUgraphNode *deps, void *edges,
                                                   size_t *count)
{
    if (cu_graph_node_of(n, -1) || !count)
        return CUDA_ERROR_INVALID_VALUE;
    if (deps) {
        for (size_t i = 0; i < *count; i++)
            deps[i] = i < n->ndeps ? n->deps[i] : NULL;
        zero_edges(edges, *count);
    }
    *count = n->ndeps;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode n, CUgraphNode *deps, size_t *count)
{
    return cuGraphNodeGetDependencies_v2(n, deps, NULL, count);
}

VGPU_EXPORT CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode n, CUgraphNode *out,
                                                     void *edges, size_t *count)
{
    if (cu_graph_node_of(n, -1) || !count)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = n->graph;
    size_t total = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!has_dep(g->nodes[i], n))
            continue;
        if (out && total < *count)
            out[total] = g->nodes[i];
        total++;
    }
    if (out) {
        for (size_t i = total; i < *count; i++)
            out[i] = NULL;
        zero_edges(edges, *count);
    }
    *count = total;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode n, CUgraphNode *out, size_t *count)
{
    return cuGraphNodeGetDependentNodes_v2(n, out, NULL, count);
}

/* ---- cloning ---- */

VGPU_EXPORT CUresult cuGraphClone(CUgraph *out, CUgraph src)
{
    if (!out || !cu_obj_is(src, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g;
    CUresult rc = cuGraphCreate(&g, 0);
    for (size_t i = 0; i < src->n && rc == CUDA_SUCCESS; i++) {
        struct CUgraphNode_st *o = src->nodes[i], proto = *o;
        CUgraphNode node;
        if (o->type == NODE_GRAPH && (rc = cuGraphClone(&proto.child, o->child)) != CUDA_SUCCESS)
            break;
        /* dependencies point at earlier clones: map them by index */
        CUgraphNode *deps = o->ndeps ? malloc(o->ndeps * sizeof *deps) : NULL;
        if (o->ndeps && !deps) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            size_t nd = 0;
            for (size_t j = 0; j < o->ndeps; j++)
                for (size_t k = 0; k < src->n; k++)
                    if (src->nodes[k] == o->deps[j] && k < g->n)
                        deps[nd++] = g->nodes[k];
            /* a dependency on a later node (cuGraphAddDependencies) is added
             * below, once every node exists */
            rc = cu_graph_add_node(&node, g, deps, nd, &proto);
            free(deps);
        }
        if (rc == CUDA_SUCCESS) {
            node->orig = o; /* cuGraphNodeFindInClone */
            if (o->attrs && (node->attrs = malloc(KERNEL_ATTRS * 64)))
                memcpy(node->attrs, o->attrs, KERNEL_ATTRS * 64);
        } else if (o->type == NODE_GRAPH) {
            cuGraphDestroy(proto.child);
        }
    }
    for (size_t i = 0; i < src->n && rc == CUDA_SUCCESS; i++) {
        struct CUgraphNode_st *o = src->nodes[i];
        for (size_t j = 0; j < o->ndeps && rc == CUDA_SUCCESS; j++) {
            for (size_t k = i; k < src->n; k++) {
                if (src->nodes[k] == o->deps[j]) {
                    CUgraphNode from = g->nodes[k], to = g->nodes[i];
                    rc = cuGraphAddDependencies(g, &from, &to, 1);
                }
            }
        }
    }
    if (rc == CUDA_SUCCESS && src->nusers) {
        g->users = cu_graph_users_copy(src->users, src->nusers);
        g->nusers = g->users ? src->nusers : 0;
    }
    if (rc) {
        cuGraphDestroy(g);
        return rc;
    }
    *out = g;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeFindInClone(CUgraphNode *out, CUgraphNode orig, CUgraph clone)
{
    if (!out || !cu_obj_is(clone, MAGIC_GRAPH) || !cu_obj_is(orig, MAGIC_NODE))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < clone->n; i++) {
        if (clone->nodes[i]->orig == orig) {
            *out = clone->nodes[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- user objects ----
 * A reference-counted object whose destructor runs when its last reference
 * goes: held by the program and by graphs (and the executables made from
 * them, which copy the graph's references). */

struct user_object {
    uint32_t magic;
    void *ptr;
    void (*destroy)(void *);
    unsigned int refs;
};

#define MAGIC_USER_OBJECT 0x56555342u
static pthread_mutex_t g_user_lock = PTHREAD_MUTEX_INITIALIZER;

static void user_release(struct user_object *o, unsigned int count)
{
    pthread_mutex_lock(&g_user_lock);
    int last = count >= o->refs;
    o->refs = last ? 0 : o->refs - count;
    pthread_mutex_unlock(&g_user_lock);
    if (last) {
        void (*fn)(void *) = o->destroy;
        void *ptr = o->ptr;
        cu_obj_del(o, sizeof *o);
        if (fn)
            fn(ptr);
    }
}

static void user_retain(struct user_object *o, unsigned int count)
{
    pthread_mutex_lock(&g_user_lock);
    o->refs += count;
    pthread_mutex_unlock(&g_user_lock);
}

void cu_graph_users_release(struct user_ref *users, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cu_obj_is(users[i].obj, MAGIC_USER_OBJECT))
            user_release(users[i].obj, users[i].count);
}

struct user_ref *cu_graph_users_copy(const struct user_ref *users, size_t n)
{
    if (!n)
        return NULL;
    struct user_ref *c = malloc(n * sizeof *c);
    if (!c)
        return NULL;
    memcpy(c, users, n * sizeof *c);
    for (size_t i = 0; i < n; i++)
        if (cu_obj_is(c[i].obj, MAGIC_USER_OBJECT))
            user_retain(c[i].obj, c[i].count);
    return c;
}

VGPU_EXPORT CUresult cuUserObjectCreate(struct user_object **out, void *ptr, void (*destroy)(void *),
                                        unsigned int refs, unsigned int flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* CU_USER_OBJECT_NO_DESTRUCTOR_SYNC is the one flag, and required */
    if (!out || !destroy || refs == 0 || flags != 1)
        return CUDA_ERROR_INVALID_VALUE;
    struct user_object *o = cu_obj_new(sizeof *o, MAGIC_USER_OBJECT);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->ptr = ptr;
    o->destroy = destroy;
    o->refs = refs;
    *out = o;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuUserObjectRetain(struct user_object *o, unsigned int count)
{
    if (!cu_obj_is(o, MAGIC_USER_OBJECT) || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    user_retain(o, count);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuUserObjectRelease(struct user_object *o, unsigned int count)
{
    if (!cu_obj_is(o, MAGIC_USER_OBJECT) || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    user_release(o, count);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphRetainUserObject(CUgraph g, struct user_object *o,
                                             unsigned int count, unsigned int flags)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !cu_obj_is(o, MAGIC_USER_OBJECT) || count == 0 ||
        flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    size_t i = 0;
    while (i < g->nusers && g->users[i].obj != o)
        i++;
    if (i == g->nusers) {
        struct user_ref *t = realloc(g->users, (g->nusers + 1) * sizeof *t);
        if (!t)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->users = t;
        g->users[g->nusers++] = (struct user_ref){o, 0};
    }
    g->users[i].count += count;
    if (!(flags & 1)) /* CU_GRAPH_USER_OBJECT_MOVE: the caller's references move */
        user_retain(o, count);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphReleaseUserObject(CUgraph g, struct user_object *o,
                                              unsigned int count)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !cu_obj_is(o, MAGIC_USER_OBJECT) || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->nusers; i++) {
        if (g->users[i].obj != o)
            continue;
        if (count > g->users[i].count)
            return CUDA_ERROR_INVALID_VALUE;
        g->users[i].count -= count;
        if (!g->users[i].count)
            g->users[i] = g->users[--g->nusers];
        user_release(o, count);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGraphDebugDotPrint: the graph in Graphviz's DOT language ---- */

static const char *node_kind(int type)
{
    static const char *const names[] = {"KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH",
                                        "EMPTY", "WAIT_EVENT", "EVENT_RECORD"};
    return type >= 0 && type <= NODE_EVENT_RECORD ? names[type] : "UNKNOWN";
}

static void dot_graph(FILE *f, CUgraph g, const char *prefix, unsigned int verbose, int depth)
{
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *n = g->nodes[i];
        fprintf(f, "\"%s_node_%zu\" [shape=%s, label=\"{%s | ID %zu", prefix, i,
                n->type == NODE_KERNEL ? "record" : "box", node_kind(n->type), i);
        if (n->type == NODE_KERNEL && cu_obj_is(n->k.func, MAGIC_FUNC))
            fprintf(f, " | %s", n->k.func->name);
        if (verbose && n->type == NODE_KERNEL)
            fprintf(f, " | grid (%u,%u,%u) | block (%u,%u,%u) | shared %u", n->k.gridDimX,
                    n->k.gridDimY, n->k.gridDimZ, n->k.blockDimX, n->k.blockDimY,
                    n->k.blockDimZ, n->k.sharedMemBytes);
        if (verbose && n->type == NODE_MEMSET)
            fprintf(f, " | dst 0x%llx | value %u | %zux%zu of %u", (unsigned long long)n->set.dst,
                    n->set.value, n->set.width, n->set.height, n->set.elementSize);
        fprintf(f, "}\"];\n");
        if (n->type == NODE_GRAPH && depth < MAX_NESTING) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s_%zu", prefix, i);
            fprintf(f, "subgraph \"cluster_%s\" {\nlabel=\"%s\";\n", sub, sub);
            dot_graph(f, n->child, sub, verbose, depth + 1);
            fprintf(f, "}\n");
        }
        for (size_t j = 0; j < n->ndeps; j++)
            for (size_t k = 0; k < g->n; k++)
                if (g->nodes[k] == n->deps[j])
                    fprintf(f, "\"%s_node_%zu\" -> \"%s_node_%zu\";\n", prefix, k, prefix, i);
    }
}

VGPU_EXPORT CUresult cuGraphDebugDotPrint(CUgraph g, const char *path, unsigned int flags)
{
    if (!cu_obj_is(g, MAGIC_GRAPH) || !path)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "w");
    if (!f)
        return CUDA_ERROR_OPERATING_SYSTEM;
    fprintf(f, "digraph dot {\nsubgraph \"cluster_graph\" {\nlabel=\"graph\";\n");
    dot_graph(f, g, "graph", flags & 1u /* CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE */, 0);
    fprintf(f, "}\n}\n");
    return fclose(f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}
