/*
 * capture.c - stream capture, and host functions (queued, or a host node
 * of a capture).
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
#include <pthread.h>
#include <stdlib.h>

#include "capture.h"
#include "exec.h"
#include "graph.h"
#include "graph_node.h"
#include "stream.h"

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
    CUresult rc = cu_graph_add_node(&node, c->graph, s->deps, s->ndeps, proto);
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
    CUresult rc = cu_graph_kernel_params(&proto, &p);
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
    RESOLVE_STREAM(h, ctx, s);
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    if (s && __atomic_load_n(&s->capture, __ATOMIC_ACQUIRE)) {
        struct CUgraphNode_st proto = {.type = NODE_HOST, .host = {fn, data}};
        pthread_mutex_lock(&cu_capture_lock);
        CUresult rc = s->capture ? capture_node(s, &proto) : CUDA_ERROR_ILLEGAL_STATE;
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
    RESOLVE_STREAM(h, ctx, s);
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
