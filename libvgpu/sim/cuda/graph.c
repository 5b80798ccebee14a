/*
 * graph.c - CUDA graphs: create a graph of kernel, memset, memcpy, host,
 * empty, child graph and event record/wait nodes with their dependencies,
 * clone and inspect it, instantiate it, update the executable and launch it
 * on a stream; and stream capture, which records such a graph.
 *
 * An executable holds the graph's nodes in a topological order (ties in the
 * order they were added), with child graphs laid out in place; a launch
 * queues them in that order (every stream of a process is one in-order
 * queue here, so dependencies hold). Kernel parameters are read when the
 * node is added, as the driver copies them then.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "exec.h"
#include "gate.h"
#include "init.h"
#include "graph.h"
#include "kernel.h"
#include "stream.h"

#define MAGIC_NODE 0x564e4f44u

enum { NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_GRAPH = 4,
       NODE_EMPTY = 5, NODE_WAIT_EVENT = 6, NODE_EVENT_RECORD = 7 };
#define KERNEL_ATTRS 16 /* kernel node attributes kept, by id (CUlaunchAttributeID) */
#define MAX_NESTING 16  /* child graphs within child graphs */

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
} CUDA_MEMSET_NODE_PARAMS;

typedef struct {
    void (*fn)(void *);
    void *userData;
} CUDA_HOST_NODE_PARAMS;

#define MEMCPY3D_BYTES 200 /* sizeof(CUDA_MEMCPY3D) on 64-bit */

struct CUgraphNode_st {
    uint32_t magic;
    int type;
    CUgraph graph;
    struct CUgraphNode_st *orig; /* in an exec: the graph's node it copies */
    struct CUgraphNode_st **deps; /* what it depends on (a graph's node only) */
    size_t ndeps;
    CUDA_KERNEL_NODE_PARAMS_v2 k;
    uint64_t ns;
    CUDA_MEMSET_NODE_PARAMS set;
    CUDA_HOST_NODE_PARAMS host;
    unsigned char copy[MEMCPY3D_BYTES];
    CUgraph child;        /* a child graph node's own copy of its graph */
    CUevent event;        /* an event record or wait node's event */
    int disabled;         /* in an exec: cuGraphNodeSetEnabled(0) */
    struct CUgraphNode_st *parent; /* in an exec: the child graph node it came from */
    unsigned char (*attrs)[64]; /* kernel node attributes (a graph's node only) */
};

struct user_ref {
    struct user_object *obj;
    unsigned int count;
};

struct CUgraph_st {
    uint32_t magic;
    size_t n, cap;
    struct CUgraphNode_st **nodes;
    struct user_ref *users;  /* user objects it holds references to */
    size_t nusers;
};

struct CUgraphExec_st {
    uint32_t magic;
    size_t n;
    struct CUgraphNode_st *nodes; /* copies */
    unsigned long long flags;
    struct user_ref *users;
    size_t nusers;
};

static void graph_release_users(struct user_ref *users, size_t n);
VGPU_EXPORT CUresult cuGraphClone(CUgraph *out, CUgraph src);
static struct user_ref *copy_users(const struct user_ref *users, size_t n);

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
    graph_release_users(g->users, g->nusers);
    free(g->users);
    cu_obj_del(g, sizeof *g);
    return CUDA_SUCCESS;
}

static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
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

static CUresult kernel_params(struct CUgraphNode_st *n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    n->k = *p;
    if (!n->k.func)
        n->k.func = (CUfunction)p->kern;
    if (!cu_obj_is(n->k.func, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_VALUE;
    n->k.kernelParams = NULL; /* read now, below; the caller's arrays may go */
    n->k.extra = NULL;
    return cu_kernel_check(n->k.func, n->k.func->mod->ctx, p->gridDimX, p->gridDimY,
                           p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
                           p->sharedMemBytes, p->kernelParams, p->extra, &n->ns);
}

VGPU_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                             size_t ndeps, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    struct CUgraphNode_st proto = {.type = NODE_KERNEL};
    CUresult rc = kernel_params(&proto, p);
    return rc ? rc : add_node(out, g, deps, ndeps, &proto);
}

/* The CUDA 10 forms, with the shorter parameter struct (no kern, ctx). */
static CUDA_KERNEL_NODE_PARAMS_v2 params_v2(const CUDA_KERNEL_NODE_PARAMS *p)
{
    CUDA_KERNEL_NODE_PARAMS_v2 v2;
    memset(&v2, 0, sizeof v2);
    memcpy(&v2, p, sizeof *p);
    return v2;
}

VGPU_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                          size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = params_v2(p);
    return cuGraphAddKernelNode_v2(out, g, deps, ndeps, &v2);
}

VGPU_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                         size_t ndeps)
{
    struct CUgraphNode_st proto = {.type = NODE_EMPTY};
    return add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddHostNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                        size_t ndeps, const CUDA_HOST_NODE_PARAMS *p)
{
    if (!p || !p->fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_HOST, .host = *p};
    return add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                          size_t ndeps, const CUDA_MEMSET_NODE_PARAMS *p,
                                          CUcontext ctx)
{
    (void)ctx;
    if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_MEMSET, .set = *p};
    return add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                          size_t ndeps, const void *p, CUcontext ctx)
{
    (void)ctx;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_MEMCPY};
    memcpy(proto.copy, p, MEMCPY3D_BYTES);
    return add_node(out, g, deps, ndeps, &proto);
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

VGPU_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!cu_obj_is(n, MAGIC_NODE) || n->type != NODE_KERNEL || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = n->k;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!cu_obj_is(n, MAGIC_NODE) || n->type != NODE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st copy = *n;
    CUresult rc = kernel_params(&copy, p);
    if (rc == CUDA_SUCCESS) {
        n->k = copy.k;
        n->ns = copy.ns;
    }
    return rc;
}

VGPU_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!cu_obj_is(n, MAGIC_NODE) || n->type != NODE_KERNEL || !p)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(p, &n->k, sizeof *p);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = params_v2(p);
    return cuGraphKernelNodeSetParams_v2(n, &v2);
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

/* ---- executable graphs ---- */

/* The nodes of g in a topological order (ties in the order they were
 * added), child graphs laid out in place, appended to *out as copies;
 * CUDA_ERROR_INVALID_VALUE for a cycle. */
static CUresult flatten(CUgraph g, struct CUgraphNode_st **out, size_t *n, size_t *cap,
                        struct CUgraphNode_st *parent, int depth)
{
    if (depth > MAX_NESTING)
        return CUDA_ERROR_INVALID_VALUE;
    size_t count = g->n;
    size_t *pending = calloc(count ? count : 1, sizeof *pending);
    unsigned char *done = calloc(count ? count : 1, 1);
    CUresult rc = pending && done ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < count && !rc; i++)
        pending[i] = g->nodes[i]->ndeps;
    for (size_t placed = 0; placed < count && !rc;) {
        size_t i = 0;
        while (i < count && (done[i] || pending[i]))
            i++;
        if (i == count) {
            rc = CUDA_ERROR_INVALID_VALUE; /* a cycle */
            break;
        }
        done[i] = 1;
        placed++;
        struct CUgraphNode_st *node = g->nodes[i];
        for (size_t k = 0; k < count; k++)
            for (size_t j = 0; j < g->nodes[k]->ndeps; j++)
                if (g->nodes[k]->deps[j] == node)
                    pending[k]--;
        if (node->type == NODE_GRAPH) {
            rc = flatten(node->child, out, n, cap, parent ? parent : node, depth + 1);
            continue;
        }
        if (*n == *cap) {
            size_t c = *cap ? 2 * *cap : 16;
            struct CUgraphNode_st *t = realloc(*out, c * sizeof *t);
            if (!t) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            *out = t;
            *cap = c;
        }
        struct CUgraphNode_st *copy = &(*out)[(*n)++];
        *copy = *node;
        copy->orig = node;
        copy->parent = parent;
        copy->deps = NULL; /* an exec runs its nodes in order */
        copy->ndeps = 0;
        copy->attrs = NULL;
    }
    free(pending);
    free(done);
    return rc;
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g,
                                                 unsigned long long flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pe || !cu_obj_is(g, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *nodes = NULL;
    size_t n = 0, cap = 0;
    CUresult rc = flatten(g, &nodes, &n, &cap, NULL, 0);
    struct CUgraphExec_st *e = rc ? NULL : cu_obj_new(sizeof *e, MAGIC_GEXEC);
    if (!e) {
        free(nodes);
        return rc ? rc : CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->nodes = nodes;
    e->n = n;
    e->flags = flags;
    e->users = copy_users(g->users, g->nusers);
    e->nusers = e->users ? g->nusers : 0;
    *pe = e;
    return CUDA_SUCCESS;
}

/* CUDA 11 form: (exec, graph, error node, log buffer, its size). */
VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err,
                                           char *log, size_t logsize)
{
    if (err)
        *err = NULL;
    if (log && logsize)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(pe, g, 0);
}

typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuGraphInstantiateWithFlags(pe, g, p->flags);
    p->hErrNode_out = NULL;
    p->result_out = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}
VGPU_ALIAS(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz)

VGPU_ALIAS(cuGraphInstantiate_v2, cuGraphInstantiate)

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    if (!cu_obj_is(e, MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_VALUE;
    free(e->nodes);
    graph_release_users(e->users, e->nusers);
    free(e->users);
    cu_obj_del(e, sizeof *e);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n,
                                                       const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(n, MAGIC_NODE))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n; i++) {
        if (e->nodes[i].orig == n) {
            struct CUgraphNode_st copy = e->nodes[i];
            CUresult rc = kernel_params(&copy, p);
            if (rc == CUDA_SUCCESS)
                e->nodes[i] = copy;
            return rc;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                    const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = params_v2(p);
    return cuGraphExecKernelNodeSetParams_v2(e, n, &v2);
}

VGPU_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    return cu_obj_is(e, MAGIC_GEXEC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
VGPU_ALIAS(cuGraphUpload, cuGraphUpload_ptsz)

VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream h)
{
    GATE_BRACKET; /* its copies and memsets touch device memory */
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!cu_obj_is(e, MAGIC_GEXEC))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        struct CUgraphNode_st *n = &e->nodes[i];
        if (n->disabled)
            continue;
        switch (n->type) {
        case NODE_EVENT_RECORD:
            rc = cuEventRecord(n->event, h);
            break;
        case NODE_WAIT_EVENT:
            rc = cuStreamWaitEvent(h, n->event, 0);
            break;
        case NODE_KERNEL:
            exec_kernel(ctx, s, n->ns);
            break;
        case NODE_HOST:
            exec_host_fn(ctx, s, n->host.fn, n->host.userData);
            break;
        case NODE_MEMSET:
            rc = cu_memset2d(n->set.dst, n->set.pitch, n->set.value, n->set.elementSize,
                             n->set.width, n->set.height);
            break;
        case NODE_MEMCPY:
            rc = cu_copy3d(n->copy);
            break;
        }
    }
    return rc;
}
VGPU_ALIAS(cuGraphLaunch, cuGraphLaunch_ptsz)

/* ---- stream capture ----
 *
 * Between cuStreamBeginCapture and cuStreamEndCapture a stream records
 * instead of running: each kernel launched on it, and each host function
 * (cuLaunchHostFunc), becomes a node of the capture's graph that depends on
 * the stream's last nodes (or on what cuStreamUpdateCaptureDependencies
 * set); a host function runs when the graph is launched, never during the
 * capture. Other streams join the capture by waiting on an event recorded in
 * it, and must be joined back into the origin stream before it ends
 * (CUDA_ERROR_STREAM_CAPTURE_UNJOINED otherwise); stream.c keeps the
 * sequences and refuses what the driver refuses during capture. Copies and
 * memsets issued to a capturing stream still happen at once (kernels never
 * touch memory here, so a replay would copy the same bytes). The legacy
 * default stream cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), as
 * on the driver; cuStreamAddCallback is not permitted in a capture.
 */

enum { CAPTURE_STATUS_NONE = 0, CAPTURE_STATUS_ACTIVE = 1, CAPTURE_STATUS_INVALIDATED = 2 };
enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_RELAXED = 2 };

static unsigned long long g_capture_ids;
static __thread int t_capture_mode = CAPTURE_MODE_GLOBAL;

/* A node added to s's capture, depending on the stream's last nodes; it
 * becomes them. Needs cu_capture_lock. */
static CUresult capture_node(CUstream s, struct CUgraphNode_st *proto)
{
    struct capture *c = s->capture;
    if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUgraphNode node;
    CUresult rc = add_node(&node, c->graph, s->deps, s->ndeps, proto);
    if (rc == CUDA_SUCCESS)
        rc = cu_capture_set_deps(s, &node, 1, 0);
    return rc;
}

CUresult cu_capture_kernel(CUstream s, CUfunction f, unsigned int gx, unsigned int gy,
                           unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                           unsigned int shmem, void **params, void **extra)
{
    CUDA_KERNEL_NODE_PARAMS_v2 p = {
        .func = f, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
        .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = shmem, .kernelParams = params,
        .extra = extra,
    };
    struct CUgraphNode_st proto = {.type = NODE_KERNEL};
    CUresult rc = kernel_params(&proto, &p);
    if (rc)
        return rc;
    pthread_mutex_lock(&cu_capture_lock);
    rc = s->capture ? capture_node(s, &proto) : CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_unlock(&cu_capture_lock);
    return rc;
}

/* ---- host functions: queued, or a host node of a capture ---- */

VGPU_EXPORT CUresult cuLaunchHostFunc(CUstream h, void (*fn)(void *), void *data)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    if (s && __atomic_load_n(&s->capture, __ATOMIC_ACQUIRE)) {
        struct CUgraphNode_st proto = {.type = NODE_HOST, .host = {fn, data}};
        pthread_mutex_lock(&cu_capture_lock);
        rc = s->capture ? capture_node(s, &proto) : CUDA_ERROR_ILLEGAL_STATE;
        pthread_mutex_unlock(&cu_capture_lock);
        if (rc != CUDA_ERROR_ILLEGAL_STATE)
            return rc;
    }
    exec_host_fn(ctx, s, fn, data);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuLaunchHostFunc, cuLaunchHostFunc_ptsz)

struct callback {
    void (*fn)(CUstream, CUresult, void *);
    CUstream stream;
    void *data;
};

static void run_callback(void *arg)
{
    struct callback *cb = arg;
    cb->fn(cb->stream, CUDA_SUCCESS, cb->data);
    free(cb);
}

VGPU_EXPORT CUresult cuStreamAddCallback(CUstream h, void (*fn)(CUstream, CUresult, void *),
                                         void *data, unsigned int flags)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!fn || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (s && cu_capture_status(s) != CAPTURE_STATUS_NONE) {
        pthread_mutex_lock(&cu_capture_lock);
        cu_capture_invalidate(s->capture);
        pthread_mutex_unlock(&cu_capture_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    struct callback *cb = malloc(sizeof *cb);
    if (!cb)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *cb = (struct callback){fn, h, data};
    exec_host_fn(ctx, s, run_callback, cb);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamAddCallback, cuStreamAddCallback_ptsz)

/* ---- beginning and ending a capture ---- */

/* A stream that may capture: a created one (not a default stream). */
static CUresult capture_stream(CUstream h, CUstream *s)
{
    CUcontext ctx;
    CUresult rc = cu_stream_resolve(h, &ctx, s);
    if (rc)
        return rc;
    return *s ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static CUresult begin_capture(CUstream h, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              int mode)
{
    CUstream s;
    CUresult rc = capture_stream(h, &s);
    if (rc)
        return rc;
    if (mode < CAPTURE_MODE_GLOBAL || mode > CAPTURE_MODE_RELAXED || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    if (g && !cu_obj_is(g, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!cu_obj_is(deps[i], MAGIC_NODE) || deps[i]->graph != g)
            return CUDA_ERROR_INVALID_VALUE;
    struct capture *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int own = !g;
    if (own && (rc = cuGraphCreate(&g, 0)) != CUDA_SUCCESS) {
        free(c);
        return rc;
    }
    pthread_mutex_lock(&cu_capture_lock);
    if (s->capture) {
        pthread_mutex_unlock(&cu_capture_lock);
        if (own)
            cuGraphDestroy(g);
        free(c);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    c->graph = g;
    c->own_graph = own;
    c->id = __atomic_add_fetch(&g_capture_ids, 1, __ATOMIC_RELAXED);
    c->mode = mode;
    c->ctx = s->ctx;
    c->origin = s;
    rc = cu_capture_join(s, c);
    if (rc == CUDA_SUCCESS)
        rc = cu_capture_set_deps(s, deps, ndeps, 0);
    if (rc) {
        cu_capture_leave(s);
        pthread_mutex_unlock(&cu_capture_lock);
        if (own)
            cuGraphDestroy(g);
        free(c->streams);
        free(c);
        return rc;
    }
    c->next = cu_captures;
    __atomic_store_n(&cu_captures, c, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cu_capture_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, int mode)
{
    return begin_capture(h, NULL, NULL, 0, mode);
}
VGPU_ALIAS(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)

VGPU_EXPORT CUresult cuStreamBeginCapture(CUstream h)
{
    return begin_capture(h, NULL, NULL, 0, CAPTURE_MODE_GLOBAL);
}
VGPU_ALIAS(cuStreamBeginCapture, cuStreamBeginCapture_ptsz)

VGPU_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                 const void *edge_data, size_t ndeps, int mode)
{
    (void)edge_data;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(h, g, deps, ndeps, mode);
}
VGPU_ALIAS(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz)

/* n, or something it depends on, however indirectly, is in `set`. */
static int reaches(struct CUgraphNode_st *n, struct CUgraphNode_st *const *set, size_t count,
                   size_t budget)
{
    /* walk back from the set: is n among its ancestors? */
    struct CUgraphNode_st **stack = malloc((budget + 1) * sizeof *stack);
    if (!stack)
        return 1; /* can't tell: don't call it unjoined */
    size_t top = 0, seen = 0;
    int found = 0;
    for (size_t i = 0; i < count && top <= budget; i++)
        stack[top++] = set[i];
    while (top && !found) {
        struct CUgraphNode_st *m = stack[--top];
        if (m == n) {
            found = 1;
            break;
        }
        if (++seen > budget * 4) { /* a large graph: give up, assume joined */
            found = 1;
            break;
        }
        for (size_t j = 0; j < m->ndeps && top <= budget; j++)
            stack[top++] = m->deps[j];
    }
    free(stack);
    return found;
}

/* Every other stream of the capture has its last nodes among the origin's
 * ancestors (it was joined back). Needs cu_capture_lock. */
static int all_joined(struct capture *c, CUstream origin)
{
    CUgraph g = c->graph;
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *n = g->nodes[i];
        /* a node is a stream's last node if nothing depends on it */
        int leaf = 1;
        for (size_t k = 0; k < g->n && leaf; k++)
            for (size_t j = 0; j < g->nodes[k]->ndeps && leaf; j++)
                if (g->nodes[k]->deps[j] == n)
                    leaf = 0;
        if (leaf && !reaches(n, origin->deps, origin->ndeps, g->n))
            return 0;
    }
    return 1;
}

/* End the capture for every stream in it; forget it. Needs cu_capture_lock. */
static void end_capture(struct capture *c)
{
    for (struct capture **p = &cu_captures; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    while (c->members > 0)
        cu_capture_leave(c->streams[c->members - 1]);
}

VGPU_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *pg)
{
    CUstream s;
    CUresult rc = capture_stream(h, &s);
    if (rc)
        return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? CUDA_ERROR_ILLEGAL_STATE : rc;
    if (!pg)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *c = s->capture;
    if (!c) {
        pthread_mutex_unlock(&cu_capture_lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (c->origin != s) {
        /* ending a capture from a stream that joined it */
        cu_capture_invalidate(c);
        pthread_mutex_unlock(&cu_capture_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    if (c->invalidated)
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (c->members > 1 && !all_joined(c, s))
        rc = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    end_capture(c);
    pthread_mutex_unlock(&cu_capture_lock);
    if (rc) {
        *pg = NULL;
        if (c->own_graph)
            cuGraphDestroy(c->graph);
    } else {
        *pg = c->graph;
    }
    /* events recorded in it keep a pointer, checked against the live
     * sequences by id before use: the memory may be freed */
    free(c->streams);
    free(c);
    return rc;
}
VGPU_ALIAS(cuStreamEndCapture, cuStreamEndCapture_ptsz)
static CUresult capture_info(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const void **edges, size_t *ndeps)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve_query(h, &ctx, &s);
    if (rc)
        return rc;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *c = s ? s->capture : NULL;
    *status = !c ? CAPTURE_STATUS_NONE
                 : c->invalidated ? CAPTURE_STATUS_INVALIDATED : CAPTURE_STATUS_ACTIVE;
    int active = *status == CAPTURE_STATUS_ACTIVE;
    if (id && c)
        *id = c->id;
    if (graph)
        *graph = active ? c->graph : NULL;
    if (deps)
        *deps = active && s->ndeps ? s->deps : NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = active ? s->ndeps : 0;
    pthread_mutex_unlock(&cu_capture_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, int *status, cuuint64_t *id)
{
    return capture_info(h, status, id, NULL, NULL, NULL, NULL);
}
VGPU_ALIAS(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz)

VGPU_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, int *status, cuuint64_t *id,
                                               CUgraph *graph, const CUgraphNode **deps,
                                               size_t *ndeps)
{
    return capture_info(h, status, id, graph, deps, NULL, ndeps);
}
VGPU_ALIAS(cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz)

VGPU_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, int *status, cuuint64_t *id,
                                               CUgraph *graph, const CUgraphNode **deps,
                                               const void **edges, size_t *ndeps)
{
    return capture_info(h, status, id, graph, deps, edges, ndeps);
}
VGPU_ALIAS(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz)

/* flags: CU_STREAM_ADD_CAPTURE_DEPENDENCIES (0) or _SET_ (1): what the
 * stream's next captured node depends on. */
VGPU_EXPORT CUresult cuStreamUpdateCaptureDependencies(CUstream h, CUgraphNode *deps, size_t n,
                                                       unsigned int flags)
{
    CUstream s;
    CUresult rc = capture_stream(h, &s);
    if (rc)
        return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? CUDA_ERROR_ILLEGAL_STATE : rc;
    if (flags > 1 || (n && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *c = s->capture;
    if (!c)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (c->invalidated)
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++)
        if (!cu_obj_is(deps[i], MAGIC_NODE) || deps[i]->graph != c->graph)
            rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = cu_capture_set_deps(s, deps, n, flags == 0);
    pthread_mutex_unlock(&cu_capture_lock);
    return rc;
}
VGPU_ALIAS(cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies_ptsz)

VGPU_EXPORT CUresult cuStreamUpdateCaptureDependencies_v2(CUstream h, CUgraphNode *deps,
                                                          const void *edges, size_t n,
                                                          unsigned int flags)
{
    (void)edges;
    return cuStreamUpdateCaptureDependencies(h, deps, n, flags);
}
VGPU_ALIAS(cuStreamUpdateCaptureDependencies_v2, cuStreamUpdateCaptureDependencies_v2_ptsz)

VGPU_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (!mode || *mode < CAPTURE_MODE_GLOBAL || *mode > CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---- graph memory ----
 * Graphs here hold no memory of their own (no memory alloc/free nodes), so
 * every attribute reads 0; the high watermarks reset to 0 (the only value
 * they may be set to). */

enum { GRAPH_MEM_USED = 0, GRAPH_MEM_USED_HIGH = 1, GRAPH_MEM_RESERVED = 2,
       GRAPH_MEM_RESERVED_HIGH = 3 };

VGPU_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!value || attr < GRAPH_MEM_USED || attr > GRAPH_MEM_RESERVED_HIGH)
        return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)value = 0;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!value || (attr != GRAPH_MEM_USED_HIGH && attr != GRAPH_MEM_RESERVED_HIGH) ||
        *(cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    return cu_check_device(dev);
}

/* ---- nodes: more kinds, their parameters, their edges ---- */

static CUresult node_of(CUgraphNode n, int type)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return cu_obj_is(n, MAGIC_NODE) && (type < 0 || n->type == type) ? CUDA_SUCCESS
                                                                      : CUDA_ERROR_INVALID_VALUE;
}

/* An exec's copies of a graph node (a node of a child graph may appear once
 * per child graph node that holds it). */
static struct CUgraphNode_st *exec_copy(CUgraphExec e, CUgraphNode n, size_t from)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(n, MAGIC_NODE))
        return NULL;
    for (size_t i = from; i < e->n; i++)
        if (e->nodes[i].orig == n || e->nodes[i].parent == n)
            return &e->nodes[i];
    return NULL;
}

VGPU_EXPORT CUresult cuGraphHostNodeGetParams(CUgraphNode n, CUDA_HOST_NODE_PARAMS *p)
{
    CUresult rc = node_of(n, NODE_HOST);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *p = n->host;
    return rc;
}

VGPU_EXPORT CUresult cuGraphHostNodeSetParams(CUgraphNode n, const CUDA_HOST_NODE_PARAMS *p)
{
    CUresult rc = node_of(n, NODE_HOST);
    if (!rc && (!p || !p->fn))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        n->host = *p;
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode n, CUDA_MEMSET_NODE_PARAMS *p)
{
    CUresult rc = node_of(n, NODE_MEMSET);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *p = n->set;
    return rc;
}

static int memset_ok(const CUDA_MEMSET_NODE_PARAMS *p)
{
    return p && (p->elementSize == 1 || p->elementSize == 2 || p->elementSize == 4);
}

VGPU_EXPORT CUresult cuGraphMemsetNodeSetParams(CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p)
{
    CUresult rc = node_of(n, NODE_MEMSET);
    if (!rc && !memset_ok(p))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        n->set = *p;
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode n, void *p)
{
    CUresult rc = node_of(n, NODE_MEMCPY);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        memcpy(p, n->copy, MEMCPY3D_BYTES);
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemcpyNodeSetParams(CUgraphNode n, const void *p)
{
    CUresult rc = node_of(n, NODE_MEMCPY);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        memcpy(n->copy, p, MEMCPY3D_BYTES);
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecHostNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                  const CUDA_HOST_NODE_PARAMS *p)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_HOST || !p || !p->fn)
        return CUDA_ERROR_INVALID_VALUE;
    c->host = *p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                    const CUDA_MEMSET_NODE_PARAMS *p,
                                                    CUcontext ctx)
{
    (void)ctx;
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_MEMSET || !memset_ok(p))
        return CUDA_ERROR_INVALID_VALUE;
    c->set = *p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode n, const void *p,
                                                    CUcontext ctx)
{
    (void)ctx;
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != NODE_MEMCPY || !p)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(c->copy, p, MEMCPY3D_BYTES);
    return CUDA_SUCCESS;
}

/* Kernel node attributes (the launch attributes that apply to a kernel:
 * access policy window, cooperative, cluster dimensions, priority, ...),
 * each a 64-byte value, kept and read back. */
VGPU_EXPORT CUresult cuGraphKernelNodeGetAttribute(CUgraphNode n, int id, void *value)
{
    CUresult rc = node_of(n, NODE_KERNEL);
    if (!rc && (!value || id <= 0 || id >= KERNEL_ATTRS))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc)
        return rc;
    memset(value, 0, 64);
    if (n->attrs)
        memcpy(value, n->attrs[id], 64);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphKernelNodeSetAttribute(CUgraphNode n, int id, const void *value)
{
    CUresult rc = node_of(n, NODE_KERNEL);
    if (!rc && (!value || id <= 0 || id >= KERNEL_ATTRS))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc)
        return rc;
    if (!n->attrs && !(n->attrs = calloc(KERNEL_ATTRS, 64)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(n->attrs[id], value, 64);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src)
{
    CUresult rc = node_of(dst, NODE_KERNEL);
    if (!rc)
        rc = node_of(src, NODE_KERNEL);
    if (rc)
        return rc;
    if (!src->attrs) {
        free(dst->attrs);
        dst->attrs = NULL;
        return CUDA_SUCCESS;
    }
    if (!dst->attrs && !(dst->attrs = calloc(KERNEL_ATTRS, 64)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(dst->attrs, src->attrs, KERNEL_ATTRS * 64);
    return CUDA_SUCCESS;
}

/* ---- event nodes ---- */

static CUresult event_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                           CUevent ev, int type)
{
    if (!cu_obj_is(ev, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = type, .event = ev};
    return add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddEventRecordNode(CUgraphNode *out, CUgraph g,
                                               const CUgraphNode *deps, size_t ndeps, CUevent ev)
{
    return event_node(out, g, deps, ndeps, ev, NODE_EVENT_RECORD);
}

VGPU_EXPORT CUresult cuGraphAddEventWaitNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                             size_t ndeps, CUevent ev)
{
    return event_node(out, g, deps, ndeps, ev, NODE_WAIT_EVENT);
}

static CUresult event_get(CUgraphNode n, CUevent *ev, int type)
{
    CUresult rc = node_of(n, type);
    if (!rc && !ev)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *ev = n->event;
    return rc;
}

static CUresult event_set(CUgraphNode n, CUevent ev, int type)
{
    CUresult rc = node_of(n, type);
    if (!rc && !cu_obj_is(ev, MAGIC_EVENT))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        n->event = ev;
    return rc;
}

VGPU_EXPORT CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode n, CUevent *ev)
{
    return event_get(n, ev, NODE_EVENT_RECORD);
}

VGPU_EXPORT CUresult cuGraphEventRecordNodeSetEvent(CUgraphNode n, CUevent ev)
{
    return event_set(n, ev, NODE_EVENT_RECORD);
}

VGPU_EXPORT CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode n, CUevent *ev)
{
    return event_get(n, ev, NODE_WAIT_EVENT);
}

VGPU_EXPORT CUresult cuGraphEventWaitNodeSetEvent(CUgraphNode n, CUevent ev)
{
    return event_set(n, ev, NODE_WAIT_EVENT);
}

static CUresult exec_event_set(CUgraphExec e, CUgraphNode n, CUevent ev, int type)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != type || !cu_obj_is(ev, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_VALUE;
    c->event = ev;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
    return exec_event_set(e, n, ev, NODE_EVENT_RECORD);
}

VGPU_EXPORT CUresult cuGraphExecEventWaitNodeSetEvent(CUgraphExec e, CUgraphNode n, CUevent ev)
{
    return exec_event_set(e, n, ev, NODE_WAIT_EVENT);
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
    rc = add_node(out, g, deps, ndeps, &proto);
    if (rc)
        cuGraphDestroy(copy);
    return rc;
}

VGPU_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *child)
{
    CUresult rc = node_of(n, NODE_GRAPH);
    if (!rc && !child)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *child = n->child;
    return rc;
}

/* The nodes of one child graph node in an exec are replaced by those of
 * `child`, which must have the same shape (nodes of the same kinds). */
VGPU_EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                        CUgraph child)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || node_of(n, NODE_GRAPH) || !cu_obj_is(child, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *nodes = NULL;
    size_t count = 0, cap = 0;
    CUresult rc = flatten(child, &nodes, &count, &cap, n, 1);
    size_t k = 0;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        if (e->nodes[i].parent != n)
            continue;
        if (k >= count || nodes[k].type != e->nodes[i].type)
            rc = CUDA_ERROR_INVALID_VALUE;
        k++;
    }
    if (rc == CUDA_SUCCESS && k != count)
        rc = CUDA_ERROR_INVALID_VALUE;
    k = 0;
    for (size_t i = 0; i < e->n && rc == CUDA_SUCCESS; i++) {
        if (e->nodes[i].parent != n)
            continue;
        struct CUgraphNode_st *orig = e->nodes[i].orig;
        e->nodes[i] = nodes[k++];
        e->nodes[i].orig = orig;
        e->nodes[i].parent = n;
    }
    free(nodes);
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
    if (node_of(n, -1) || !count)
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
    if (node_of(n, -1) || !count)
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
            rc = add_node(&node, g, deps, nd, &proto);
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
        g->users = copy_users(src->users, src->nusers);
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

/* ---- executables: enabling nodes, flags, updates ---- */

VGPU_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned int on)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || (c->type != NODE_KERNEL && c->type != NODE_MEMCPY && c->type != NODE_MEMSET))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->n; i++)
        if (e->nodes[i].orig == n)
            e->nodes[i].disabled = !on;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphNodeGetEnabled(CUgraphExec e, CUgraphNode n, unsigned int *on)
{
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || !on || (c->type != NODE_KERNEL && c->type != NODE_MEMCPY && c->type != NODE_MEMSET))
        return CUDA_ERROR_INVALID_VALUE;
    *on = !c->disabled;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGraphExecGetFlags(CUgraphExec e, cuuint64_t *flags)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = e->flags;
    return CUDA_SUCCESS;
}

enum { UPDATE_SUCCESS = 0, UPDATE_TOPOLOGY_CHANGED = 2, UPDATE_NODE_TYPE_CHANGED = 3 };

typedef struct {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* The executable takes the parameters of g's nodes, if g has the same
 * shape (as many nodes, of the same kinds, in the same order) as the graph
 * it was made from; CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE otherwise, the
 * executable unchanged. */
VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g,
                                          CUgraphExecUpdateResultInfo *info)
{
    if (!cu_obj_is(e, MAGIC_GEXEC) || !cu_obj_is(g, MAGIC_GRAPH) || !info)
        return CUDA_ERROR_INVALID_VALUE;
    memset(info, 0, sizeof *info);
    struct CUgraphNode_st *nodes = NULL;
    size_t n = 0, cap = 0;
    CUresult rc = flatten(g, &nodes, &n, &cap, NULL, 0);
    if (rc) {
        free(nodes);
        return rc;
    }
    int result = n != e->n ? UPDATE_TOPOLOGY_CHANGED : UPDATE_SUCCESS;
    for (size_t i = 0; i < n && result == UPDATE_SUCCESS; i++) {
        if (nodes[i].type != e->nodes[i].type) {
            result = UPDATE_NODE_TYPE_CHANGED;
            info->errorNode = nodes[i].orig;
        }
    }
    info->result = result;
    if (result == UPDATE_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            struct CUgraphNode_st *orig = e->nodes[i].orig, *parent = e->nodes[i].parent;
            int disabled = e->nodes[i].disabled;
            e->nodes[i] = nodes[i];
            e->nodes[i].orig = orig;
            e->nodes[i].parent = parent;
            e->nodes[i].disabled = disabled;
        }
    }
    free(nodes);
    return result == UPDATE_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, int *result)
{
    CUgraphExecUpdateResultInfo info;
    CUresult rc = cuGraphExecUpdate_v2(e, g, &info);
    if (err)
        *err = info.errorNode;
    if (result)
        *result = info.result;
    return rc;
}

/* ---- CUDA 12's generic node parameters (CUgraphNodeParams) ---- */

struct node_params {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
        struct {
            int flags, reserved;
            CUcontext ctx;
            unsigned char copy[MEMCPY3D_BYTES];
        } memcpy;
        struct {
            CUDA_MEMSET_NODE_PARAMS set;
            CUcontext ctx;
        } memset;
        CUDA_HOST_NODE_PARAMS host;
        CUgraph graph;
        CUevent event;
    } u;
    long long reserved2;
};

/* A node's parameters from p, into proto (its type already set). */
static CUresult params_from(struct CUgraphNode_st *proto, const struct node_params *p)
{
    switch (p->type) {
    case NODE_KERNEL:
        return kernel_params(proto, &p->u.kernel);
    case NODE_MEMCPY:
        memcpy(proto->copy, p->u.memcpy.copy, MEMCPY3D_BYTES);
        return CUDA_SUCCESS;
    case NODE_MEMSET:
        if (!memset_ok(&p->u.memset.set))
            return CUDA_ERROR_INVALID_VALUE;
        proto->set = p->u.memset.set;
        return CUDA_SUCCESS;
    case NODE_HOST:
        if (!p->u.host.fn)
            return CUDA_ERROR_INVALID_VALUE;
        proto->host = p->u.host;
        return CUDA_SUCCESS;
    case NODE_EMPTY:
        return CUDA_SUCCESS;
    case NODE_WAIT_EVENT:
    case NODE_EVENT_RECORD:
        if (!cu_obj_is(p->u.event, MAGIC_EVENT))
            return CUDA_ERROR_INVALID_VALUE;
        proto->event = p->u.event;
        return CUDA_SUCCESS;
    case NODE_GRAPH:
        return CUDA_ERROR_INVALID_VALUE; /* set by cuGraphAddNode only */
    default:
        return CUDA_ERROR_NOT_SUPPORTED; /* semaphores, memory, conditionals */
    }
}

VGPU_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                       const void *edges, size_t ndeps, struct node_params *p)
{
    (void)edges;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == NODE_GRAPH)
        return cuGraphAddChildGraphNode(out, g, deps, ndeps, p->u.graph);
    struct CUgraphNode_st proto = {.type = p->type};
    CUresult rc = params_from(&proto, p);
    return rc ? rc : add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                    size_t ndeps, struct node_params *p)
{
    return cuGraphAddNode_v2(out, g, deps, NULL, ndeps, p);
}

VGPU_EXPORT CUresult cuGraphNodeSetParams(CUgraphNode n, struct node_params *p)
{
    if (node_of(n, -1) || !p || p->type != n->type || p->type == NODE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st copy = *n;
    CUresult rc = params_from(&copy, p);
    if (rc == CUDA_SUCCESS) {
        unsigned char (*attrs)[64] = n->attrs;
        *n = copy;
        n->attrs = attrs;
    }
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n,
                                              struct node_params *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == NODE_GRAPH)
        return cuGraphExecChildGraphNodeSetParams(e, n, p->u.graph);
    struct CUgraphNode_st *c = exec_copy(e, n, 0);
    if (!c || c->type != p->type)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st copy = *c;
    CUresult rc = params_from(&copy, p);
    if (rc == CUDA_SUCCESS)
        *c = copy;
    return rc;
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

static void graph_release_users(struct user_ref *users, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cu_obj_is(users[i].obj, MAGIC_USER_OBJECT))
            user_release(users[i].obj, users[i].count);
}

static struct user_ref *copy_users(const struct user_ref *users, size_t n)
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
