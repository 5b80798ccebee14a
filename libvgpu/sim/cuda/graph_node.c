/*
 * graph_node.c - the kinds of graph node: kernel, memset, memcpy, host,
 * empty, event record and wait nodes added to a graph (graph.c adds child
 * graph nodes), their parameters read and set, kernel node attributes, and
 * CUDA 12's generic node parameters. Kernel parameters are read when the
 * node is added, as the driver copies them then.
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_node.h"
#include "kernel.h"

CUresult cu_graph_kernel_params(struct CUgraphNode_st *n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
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
    CUresult rc = cu_graph_kernel_params(&proto, p);
    return rc ? rc : cu_graph_add_node(out, g, deps, ndeps, &proto);
}

/* The CUDA 10 forms, with the shorter parameter struct (no kern, ctx). */
CUDA_KERNEL_NODE_PARAMS_v2 cu_graph_params_v2(const CUDA_KERNEL_NODE_PARAMS *p)
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
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = cu_graph_params_v2(p);
    return cuGraphAddKernelNode_v2(out, g, deps, ndeps, &v2);
}

VGPU_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                         size_t ndeps)
{
    struct CUgraphNode_st proto = {.type = NODE_EMPTY};
    return cu_graph_add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddHostNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                        size_t ndeps, const CUDA_HOST_NODE_PARAMS *p)
{
    if (!p || !p->fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_HOST, .host = *p};
    return cu_graph_add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                          size_t ndeps, const CUDA_MEMSET_NODE_PARAMS *p,
                                          CUcontext ctx)
{
    (void)ctx;
    if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_MEMSET, .set = *p};
    return cu_graph_add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                          size_t ndeps, const void *p, CUcontext ctx)
{
    (void)ctx;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st proto = {.type = NODE_MEMCPY};
    memcpy(proto.copy, p, MEMCPY3D_BYTES);
    return cu_graph_add_node(out, g, deps, ndeps, &proto);
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
    CUresult rc = cu_graph_kernel_params(&copy, p);
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
    CUDA_KERNEL_NODE_PARAMS_v2 v2 = cu_graph_params_v2(p);
    return cuGraphKernelNodeSetParams_v2(n, &v2);
}

/* ---- nodes: more kinds, their parameters ---- */

VGPU_EXPORT CUresult cuGraphHostNodeGetParams(CUgraphNode n, CUDA_HOST_NODE_PARAMS *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_HOST);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *p = n->host;
    return rc;
}

VGPU_EXPORT CUresult cuGraphHostNodeSetParams(CUgraphNode n, const CUDA_HOST_NODE_PARAMS *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_HOST);
    if (!rc && (!p || !p->fn))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        n->host = *p;
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode n, CUDA_MEMSET_NODE_PARAMS *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_MEMSET);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *p = n->set;
    return rc;
}

int cu_graph_memset_ok(const CUDA_MEMSET_NODE_PARAMS *p)
{
    return p && (p->elementSize == 1 || p->elementSize == 2 || p->elementSize == 4);
}

VGPU_EXPORT CUresult cuGraphMemsetNodeSetParams(CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_MEMSET);
    if (!rc && !cu_graph_memset_ok(p))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        n->set = *p;
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode n, void *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_MEMCPY);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        memcpy(p, n->copy, MEMCPY3D_BYTES);
    return rc;
}

VGPU_EXPORT CUresult cuGraphMemcpyNodeSetParams(CUgraphNode n, const void *p)
{
    CUresult rc = cu_graph_node_of(n, NODE_MEMCPY);
    if (!rc && !p)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        memcpy(n->copy, p, MEMCPY3D_BYTES);
    return rc;
}

/* Kernel node attributes (the launch attributes that apply to a kernel:
 * access policy window, cooperative, cluster dimensions, priority, ...),
 * each a 64-byte value, kept and read back. */
VGPU_EXPORT CUresult cuGraphKernelNodeGetAttribute(CUgraphNode n, int id, void *value)
{
    CUresult rc = cu_graph_node_of(n, NODE_KERNEL);
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
    CUresult rc = cu_graph_node_of(n, NODE_KERNEL);
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
    CUresult rc = cu_graph_node_of(dst, NODE_KERNEL);
    if (!rc)
        rc = cu_graph_node_of(src, NODE_KERNEL);
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
    return cu_graph_add_node(out, g, deps, ndeps, &proto);
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
    CUresult rc = cu_graph_node_of(n, type);
    if (!rc && !ev)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc)
        *ev = n->event;
    return rc;
}

static CUresult event_set(CUgraphNode n, CUevent ev, int type)
{
    CUresult rc = cu_graph_node_of(n, type);
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

/* ---- CUDA 12's generic node parameters (CUgraphNodeParams) ---- */

/* A node's parameters from p, into proto (its type already set). */
CUresult cu_graph_params_from(struct CUgraphNode_st *proto, const struct node_params *p)
{
    switch (p->type) {
    case NODE_KERNEL:
        return cu_graph_kernel_params(proto, &p->u.kernel);
    case NODE_MEMCPY:
        memcpy(proto->copy, p->u.memcpy.copy, MEMCPY3D_BYTES);
        return CUDA_SUCCESS;
    case NODE_MEMSET:
        if (!cu_graph_memset_ok(&p->u.memset.set))
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
    CUresult rc = cu_graph_params_from(&proto, p);
    return rc ? rc : cu_graph_add_node(out, g, deps, ndeps, &proto);
}

VGPU_EXPORT CUresult cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                    size_t ndeps, struct node_params *p)
{
    return cuGraphAddNode_v2(out, g, deps, NULL, ndeps, p);
}

VGPU_EXPORT CUresult cuGraphNodeSetParams(CUgraphNode n, struct node_params *p)
{
    if (cu_graph_node_of(n, -1) || !p || p->type != n->type || p->type == NODE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st copy = *n;
    CUresult rc = cu_graph_params_from(&copy, p);
    if (rc == CUDA_SUCCESS) {
        unsigned char (*attrs)[64] = n->attrs;
        *n = copy;
        n->attrs = attrs;
    }
    return rc;
}
