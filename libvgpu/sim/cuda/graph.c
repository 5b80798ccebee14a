/*
 * graph.c - CUDA graphs: create a graph, add kernel, memset, memcpy,
 * host and empty nodes, instantiate it and launch it on a stream.
 *
 * Nodes are kept in the order they were added, which is a valid topological
 * order (a node's dependencies exist before it); a launch queues them in that
 * order. Kernel parameters are read when the node is added, as the driver
 * copies them then.
 */
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

enum { NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_EMPTY = 5 };

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
    CUDA_KERNEL_NODE_PARAMS_v2 k;
    uint64_t ns;
    CUDA_MEMSET_NODE_PARAMS set;
    CUDA_HOST_NODE_PARAMS host;
    unsigned char copy[MEMCPY3D_BYTES];
};

struct CUgraph_st {
    uint32_t magic;
    size_t n, cap;
    struct CUgraphNode_st **nodes;
};

struct CUgraphExec_st {
    uint32_t magic;
    size_t n;
    struct CUgraphNode_st *nodes; /* copies */
};

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
    for (size_t i = 0; i < g->n; i++)
        cu_obj_del(g->nodes[i], sizeof *g->nodes[i]);
    free(g->nodes);
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
    struct CUgraphNode_st *n = cu_obj_new(sizeof *n, MAGIC_NODE);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *n = *proto;
    n->magic = MAGIC_NODE;
    n->graph = g;
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
    cu_obj_del(n, sizeof *n);
    return CUDA_SUCCESS;
}

/* ---- executable graphs ---- */

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g,
                                                 unsigned long long flags)
{
    (void)flags;
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pe || !cu_obj_is(g, MAGIC_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = cu_obj_new(sizeof *e, MAGIC_GEXEC);
    e->nodes = calloc(g->n ? g->n : 1, sizeof *e->nodes);
    if (!e->nodes) {
        cu_obj_del(e, sizeof *e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < g->n; i++) {
        e->nodes[i] = *g->nodes[i];
        e->nodes[i].orig = g->nodes[i];
    }
    e->n = g->n;
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
        switch (n->type) {
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
 * instead of running: each kernel launched on it becomes a kernel node of
 * the capture's graph, depending on the node captured before it (or on what
 * cuStreamUpdateCaptureDependencies set). Copies and memsets issued to a
 * capturing stream still happen at once (kernels never touch memory here, so
 * a replay would copy the same bytes). The legacy default stream cannot
 * capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), as on the driver.
 */

enum { CAPTURE_STATUS_NONE = 0, CAPTURE_STATUS_ACTIVE = 1 };
enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_RELAXED = 2 };

static unsigned long long g_capture_ids;
static __thread int t_capture_mode = CAPTURE_MODE_GLOBAL;

CUresult cu_capture_kernel(CUstream s, CUfunction f, unsigned int gx, unsigned int gy,
                           unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                           unsigned int shmem, void **params, void **extra)
{
    CUDA_KERNEL_NODE_PARAMS_v2 p = {
        .func = f, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
        .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = shmem, .kernelParams = params,
        .extra = extra,
    };
    CUgraphNode node;
    CUresult rc = cuGraphAddKernelNode_v2(&node, s->capture, s->capture_last ? &s->capture_last : NULL,
                                          s->capture_last ? 1 : 0, &p);
    if (rc == CUDA_SUCCESS)
        s->capture_last = node;
    return rc;
}

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
    if (s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (!g) {
        rc = cuGraphCreate(&g, 0);
        if (rc)
            return rc;
    } else if (!cu_obj_is(g, MAGIC_GRAPH)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    s->capture_mode = mode;
    s->capture_last = ndeps ? deps[ndeps - 1] : NULL;
    s->capture_id = __atomic_add_fetch(&g_capture_ids, 1, __ATOMIC_RELAXED);
    s->capture = g;
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

VGPU_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *pg)
{
    CUstream s;
    CUresult rc = capture_stream(h, &s);
    if (rc)
        return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? CUDA_ERROR_ILLEGAL_STATE : rc;
    if (!pg)
        return CUDA_ERROR_INVALID_VALUE;
    if (!s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    *pg = s->capture;
    s->capture = NULL;
    s->capture_last = NULL;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamEndCapture, cuStreamEndCapture_ptsz)

static CUresult capture_info(CUstream h, int *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const void **edges, size_t *ndeps)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    int active = s && s->capture;
    *status = active ? CAPTURE_STATUS_ACTIVE : CAPTURE_STATUS_NONE;
    if (id && active)
        *id = s->capture_id;
    if (graph)
        *graph = active ? s->capture : NULL;
    if (deps)
        *deps = active && s->capture_last ? &s->capture_last : NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = active && s->capture_last ? 1 : 0;
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

/* flags: CU_STREAM_ADD_CAPTURE_DEPENDENCIES (0) or _SET_ (1). Nodes run in the
 * order they were added, so the last one named is what the next depends on. */
VGPU_EXPORT CUresult cuStreamUpdateCaptureDependencies(CUstream h, CUgraphNode *deps, size_t n,
                                                       unsigned int flags)
{
    CUstream s;
    CUresult rc = capture_stream(h, &s);
    if (rc)
        return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? CUDA_ERROR_ILLEGAL_STATE : rc;
    if (flags > 1 || (n && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    if (!s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    for (size_t i = 0; i < n; i++)
        if (!cu_obj_is(deps[i], MAGIC_NODE) || deps[i]->graph != s->capture)
            return CUDA_ERROR_INVALID_VALUE;
    if (n)
        s->capture_last = deps[n - 1];
    else if (flags == 1)
        s->capture_last = NULL;
    return CUDA_SUCCESS;
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
